"""Argument types of the ``sailor`` command: a bad value is refused by argparse (exit 2), naming
the value and what is valid, before anything runs."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import TypeVar

N = TypeVar("N", int, float)


def _checked(convert: Callable[[str], N], ok: Callable[[N], bool], need: str) -> Callable[[str], N]:
    """An argparse type: ``convert(value)`` when it works and passes ``ok``, else an error saying
    ``need``."""

    def parse(value: str) -> N:
        try:
            x = convert(value)
        except ValueError:
            x = None
        if x is None or not ok(x):
            raise argparse.ArgumentTypeError(f"{value!r}: need {need}")
        return x

    parse.__name__ = need  # argparse names the type in some messages
    return parse


seed = _checked(int, lambda n: n >= 0, "an integer ≥ 0")
"""A random seed: an integer ≥ 0."""
positive_int = _checked(int, lambda n: n >= 1, "an integer ≥ 1")
positive_float = _checked(float, lambda x: 0 < x < math.inf, "a number > 0")
nonnegative_float = _checked(float, lambda x: 0 <= x < math.inf, "a number ≥ 0")
