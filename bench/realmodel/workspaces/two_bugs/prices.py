"""Turn price texts from the supplier's CSV export into numbers."""


def parse_price(text):
    """'$1,234.50' -> 1234.5; ' 12 ' -> 12.0"""
    cleaned = text.strip()
    return float(cleaned)


def total(texts):
    """Sum of the prices in texts."""
    return sum(parse_price(t) for t in texts)
