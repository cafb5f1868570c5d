import unittest

from report import report
from textutils import count_lines, word_count


class TextutilsTest(unittest.TestCase):
    def test_word_count(self):
        self.assertEqual(word_count("one two  three"), 3)
        self.assertEqual(word_count(""), 0)

    def test_count_lines(self):
        self.assertEqual(count_lines("a\n\nb\n"), 2)

    def test_report(self):
        self.assertEqual(report("hello world\nbye"), "3 words, 2 lines")


if __name__ == "__main__":
    unittest.main()
