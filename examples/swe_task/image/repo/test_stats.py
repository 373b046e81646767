import unittest

import stats


class MeanTest(unittest.TestCase):
    def test_mean(self) -> None:
        self.assertEqual(stats.mean([1, 2, 3, 6]), 3)

    def test_one_value(self) -> None:
        self.assertEqual(stats.mean([5]), 5)


if __name__ == "__main__":
    unittest.main()
