"""Helpers over order records."""


def open_orders(orders):
    return [o for o in orders if o["status"] == "open"]


def shipped_orders(orders):
    return [o for o in orders if o["status"] == "shipped"]
