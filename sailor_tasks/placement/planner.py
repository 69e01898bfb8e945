"""Compatibility home of ``plan`` and ``price_cap_error`` (``stages.validate`` imports them here).

The engine lives in ``engine.py`` (search, explanation, batch planning), with its rules in
``validators.py`` / ``preferences.py`` / ``market.py`` and reservations in ``reservations.py``.
"""

from __future__ import annotations

from sailor_tasks.placement.engine import plan, plan_many, price_cap_error

__all__ = ["plan", "plan_many", "price_cap_error"]
