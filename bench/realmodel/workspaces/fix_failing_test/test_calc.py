import unittest

from calc import add, average, multiply, subtract


class CalcTest(unittest.TestCase):
    def test_add(self):
        self.assertEqual(add(2, 3), 5)

    def test_subtract(self):
        self.assertEqual(subtract(5, 3), 2)
        self.assertEqual(subtract(1, 4), -3)

    def test_multiply(self):
        self.assertEqual(multiply(4, 3), 12)

    def test_average(self):
        self.assertEqual(average([1, 2, 3, 6]), 3)
        self.assertEqual(average([]), 0)


if __name__ == "__main__":
    unittest.main()
