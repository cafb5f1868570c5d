import unittest

from report import report
from textutils import count_lines, count_words


class TextutilsTest(unittest.TestCase):
    def test_count_words(self):
        self.assertEqual(count_words("one two  three"), 3)
        self.assertEqual(count_words(""), 0)

    def test_count_lines(self):
        self.assertEqual(count_lines("a\n\nb\n"), 2)

    def test_report(self):
        self.assertEqual(report("hello world\nbye"), "3 words, 2 lines")


if __name__ == "__main__":
    unittest.main()
