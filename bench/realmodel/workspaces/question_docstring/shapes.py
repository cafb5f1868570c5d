"""Areas and perimeters of simple shapes."""

import math


def circle_area(radius):
    """Area of a circle with the given radius."""
    return math.pi * radius**2


def rectangle_area(width, height):
    """Area of a width x height rectangle."""
    return width * height


def triangle_area(base, height):
    """Area of a triangle from its base and height."""
    return base * height / 2


def rectangle_perimeter(width, height):
    return 2 * (width + height)


def circle_perimeter(radius):
    """Circumference of a circle."""
    return 2 * math.pi * radius
