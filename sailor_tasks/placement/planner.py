"""Compatibility home of ``plan``, ``price_cap_error`` and ``never_feasible_error`` (``stages.validate`` imports them here).

The engine lives in ``engine.py`` (search, explanation, batch planning), with its rules in
``validators.py`` / ``preferences.py`` / ``market.py`` and reservations in ``reservations.py``.
"""

from __future__ import annotations

from sailor_tasks.placement.engine import never_feasible_error, plan, plan_many, price_cap_error

__all__ = ["never_feasible_error", "plan", "plan_many", "price_cap_error"]
