"""A tiny command line over inventory.py: python3 cli.py add apple 3 0.5"""

import sys

from inventory import add_item, remove_item, total_value


def main(argv):
    if len(argv) < 2:
        print("usage: cli.py add NAME QTY PRICE | remove NAME QTY | value")
        return 2
    command = argv[1]
    if command == "add":
        add_item(argv[2], int(argv[3]), float(argv[4]))
    elif command == "remove":
        remove_item(argv[2], int(argv[3]))
    elif command == "value":
        print(f"{total_value():.2f}")
    else:
        print(f"unknown command {command}")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
