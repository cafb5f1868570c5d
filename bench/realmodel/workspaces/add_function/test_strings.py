import unittest

from strings import normalize, same_answer


class StringsTest(unittest.TestCase):
    def test_normalize(self):
        self.assertEqual(normalize("Hello, World!"), "helloworld")

    def test_same_answer(self):
        self.assertTrue(same_answer("Paris!", "paris"))
        self.assertFalse(same_answer("Rome", "Paris"))


if __name__ == "__main__":
    unittest.main()
