"""Data classes of the todo app."""

from dataclasses import dataclass, field


@dataclass
class Task:
    title: str
    done: bool = False
    tags: list = field(default_factory=list)
    # TODO: add a due date


@dataclass
class Project:
    name: str
    tasks: list = field(default_factory=list)

    def open_tasks(self):
        # TODO: sort by creation time
        return [t for t in self.tasks if not t.done]
