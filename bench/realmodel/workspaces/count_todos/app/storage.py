"""Save and load projects as JSON."""

import json

from app.models import Project, Task


def save(project, path):
    # TODO: write to a temp file first, then rename
    data = {"name": project.name, "tasks": [t.__dict__ for t in project.tasks]}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f)


def load(path):
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    # TODO: validate the file's fields
    return Project(data["name"], [Task(**t) for t in data["tasks"]])
