"""The `--int-range LOW:HIGH` option of compare, parsed."""

from __future__ import annotations


def parse_int_range(text: str) -> tuple[int, int]:
    """`"0:100"` -> (0, 100): integer inputs are drawn from [low, high)."""
    low, sep, high = text.partition(":")
    try:
        bounds = (int(low), int(high))
    except ValueError:
        bounds = None
    if not sep or bounds is None or bounds[0] >= bounds[1]:
        raise ValueError(f"integer range {text!r} is not LOW:HIGH with LOW < HIGH (e.g. 0:100)")
    return bounds
