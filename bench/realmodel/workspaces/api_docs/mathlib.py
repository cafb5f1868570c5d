"""Number helpers for the statistics course."""


def clamp(value, low, high):
    """Limit value to the range low..high."""
    return max(low, min(high, value))


def mean(values):
    """Arithmetic mean of a non-empty list."""
    return sum(values) / len(values)


def median(values):
    """Middle value of a non-empty list."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2


def _check(values):
    if not values:
        raise ValueError("empty list")


def percent(part, whole):
    """Share of part in whole, in percent, rounded to one decimal."""
    return round(100 * part / whole, 1)
