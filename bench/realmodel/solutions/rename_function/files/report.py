"""Print a short report about a text file: python3 report.py FILE"""

import sys

from textutils import count_lines, word_count


def report(text):
    return f"{word_count(text)} words, {count_lines(text)} lines"


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        print(report(f.read()))
