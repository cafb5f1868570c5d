"""String helpers for the quiz game."""


def normalize(text):
    """Lower-case text and drop everything but letters and digits."""
    return "".join(ch for ch in text.lower() if ch.isalnum())


def same_answer(given, expected):
    """True when the player's answer matches, ignoring case and punctuation."""
    return normalize(given) == normalize(expected)
