"""Argument types of the ``sailor`` command: a bad value is refused by argparse (exit 2), naming
the value and what is valid, before anything runs."""

from __future__ import annotations

import argparse


def seed(value: str) -> int:
    """A random seed: an integer ≥ 0."""
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: need an integer ≥ 0") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"{value!r}: need an integer ≥ 0")
    return n


def positive_float(value: str) -> float:
    """A number > 0."""
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: need a number > 0") from None
    if not x > 0 or x == float("inf"):
        raise argparse.ArgumentTypeError(f"{value!r}: need a number > 0")
    return x


def nonnegative_float(value: str) -> float:
    """A number ≥ 0."""
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: need a number ≥ 0") from None
    if not x >= 0 or x == float("inf"):
        raise argparse.ArgumentTypeError(f"{value!r}: need a number ≥ 0")
    return x


def positive_int(value: str) -> int:
    """An integer ≥ 1."""
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: need an integer ≥ 1") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{value!r}: need an integer ≥ 1")
    return n
