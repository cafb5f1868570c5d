import unittest

from prices import parse_price, total


class ParsePriceTest(unittest.TestCase):
    def test_plain(self):
        self.assertEqual(parse_price(" 12 "), 12.0)

    def test_dollar_sign(self):
        self.assertEqual(parse_price("$19.99"), 19.99)

    def test_thousands_separator(self):
        self.assertEqual(parse_price("$1,234.50"), 1234.5)

    def test_total(self):
        self.assertEqual(total(["$1", "2", "$1,000"]), 1003.0)


if __name__ == "__main__":
    unittest.main()
