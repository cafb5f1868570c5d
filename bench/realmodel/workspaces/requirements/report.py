"""Print a table of the stored rates."""

import csv
import sys

from tabulate import tabulate


def main():
    with open("data/rates.csv", newline="") as f:
        rows = list(csv.reader(f))
    print(tabulate(rows[1:], headers=rows[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
