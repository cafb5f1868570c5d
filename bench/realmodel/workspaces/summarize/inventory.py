"""Keep track of items in a small shop's stock."""

STOCK = {}


def add_item(name, quantity, price):
    """Add quantity units of an item at the given unit price."""
    if quantity <= 0:
        raise ValueError("quantity must be positive")
    entry = STOCK.setdefault(name, {"quantity": 0, "price": price})
    entry["quantity"] += quantity
    entry["price"] = price


def remove_item(name, quantity):
    """Take quantity units of an item out of stock."""
    entry = STOCK.get(name)
    if entry is None or entry["quantity"] < quantity:
        raise KeyError(f"not enough {name} in stock")
    entry["quantity"] -= quantity
    if entry["quantity"] == 0:
        del STOCK[name]


def total_value():
    """The value of everything in stock."""
    return sum(e["quantity"] * e["price"] for e in STOCK.values())
