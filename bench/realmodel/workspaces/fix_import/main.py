"""Print how many orders are still open: python3 main.py"""

from order_utils import open_orders

ORDERS = [
    {"id": 1, "status": "open"},
    {"id": 2, "status": "shipped"},
    {"id": 3, "status": "open"},
    {"id": 4, "status": "open"},
]

if __name__ == "__main__":
    print(f"open orders: {len(open_orders(ORDERS))}")
