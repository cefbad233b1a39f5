"""argparse value types for the retrieval CLIs: a bad value is an argparse error (usage, exit 2), never a traceback."""

from __future__ import annotations

import argparse
import math


def int_in(low: int, high: int | None = None):
    """An integer in ``low..high`` (``high`` None: no upper bound)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f">= {low}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
        return value

    parse.__name__ = "integer"  # argparse names the type in its messages
    return parse


def float_in(low: float, high: float | None = None, low_open: bool = False):
    """A finite number in ``low..high`` (``low_open``: strictly above ``low``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if (
            not math.isfinite(value)
            or value < low
            or (low_open and value == low)
            or (high is not None and value > high)
        ):
            lower = f"> {low:g}" if low_open else f">= {low:g}"
            bound = f"{lower} and <= {high:g}" if high is not None else lower
            raise argparse.ArgumentTypeError(f"must be a finite number {bound}, got {text}")
        return value

    parse.__name__ = "number"
    return parse


PORT = int_in(1, 65535)
POSITIVE_INT = int_in(1)
