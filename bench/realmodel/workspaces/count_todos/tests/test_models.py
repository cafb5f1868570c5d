import unittest

from app.models import Project, Task


class ProjectTest(unittest.TestCase):
    def test_open_tasks(self):
        p = Project("home", [Task("a"), Task("b", done=True)])
        self.assertEqual([t.title for t in p.open_tasks()], ["a"])

    # TODO: test tags


if __name__ == "__main__":
    unittest.main()
