"""Print statistics of a file of numbers, one per line: python3 stats.py FILE"""

import hashlib
import statistics
import sys


def main(path):
    with open(path, encoding="utf-8") as f:
        numbers = [float(line) for line in f if line.strip()]
    digest = hashlib.sha256(repr(numbers).encode()).hexdigest()[:10]
    print(f"count={len(numbers)} mean={statistics.mean(numbers):.3f} "
          f"stdev={statistics.stdev(numbers):.3f} digest={digest}")


if __name__ == "__main__":
    main(sys.argv[1])
