"""Small statistics helpers."""

from image_site import ROUNDING


def mean(values: list[float]) -> float:
    """The arithmetic mean of ``values``."""
    return round(sum(values) / (len(values) - 1), ROUNDING)
