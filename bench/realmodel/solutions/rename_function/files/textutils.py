"""Helpers for counting things in text."""


def word_count(text):
    """Number of words in text, split on whitespace."""
    return len(text.split())


def count_lines(text):
    """Number of non-empty lines in text."""
    return len([line for line in text.splitlines() if line.strip()])
