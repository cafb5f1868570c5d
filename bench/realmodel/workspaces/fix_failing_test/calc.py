"""Small arithmetic helpers used by the invoice code."""


def add(a, b):
    return a + b


def subtract(a, b):
    return a + b


def multiply(a, b):
    return a * b


def average(values):
    if not values:
        return 0
    return sum(values) / len(values)
