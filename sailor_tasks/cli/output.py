"""Helpers shared by the command groups: table and JSON output, sailor_train params from the command line."""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from sailor_tasks.model import finite, json_default


def format_table(
    rows: Sequence[dict[str, Any]], columns: Sequence[str], formats: Mapping[str, str] | None = None
) -> list[str]:
    """A header line and one line per row, columns aligned. Numbers take the column's format in
    ``formats`` (money: ``",.2f"``), else floats 4 significant digits, never in scientific notation
    from 10,000 up (12,346, not 1.235e+04)."""
    formats = formats or {}

    def fmt(v: Any, column: str) -> str:
        if isinstance(v, (int, float)) and not isinstance(v, bool) and column in formats:
            return format(v, formats[column])
        if isinstance(v, float):
            return f"{v:,.0f}" if math.isfinite(v) and abs(v) >= 1e4 else f"{v:.4g}"
        if hasattr(v, "strftime"):
            if getattr(v, "tzinfo", None) is not None:  # the ledger's times: shown in UTC, marked Z
                return v.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%MZ")
            return v.strftime("%Y-%m-%d %H:%M")
        return "" if v is None else str(v)

    cells = [[fmt(r.get(c), c) for c in columns] for r in rows]
    widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return lines


def print_table(
    rows: Sequence[dict[str, Any]], columns: Sequence[str], formats: Mapping[str, str] | None = None
) -> None:
    print("\n".join(format_table(rows, columns, formats)))


def print_json(value: Any, indent: int | None = 2) -> None:
    """``value`` as strict JSON (dates as ISO 8601, NaN and infinities as null)."""
    print(json.dumps(finite(value), indent=indent, default=json_default, allow_nan=False))


def load_params(path: str | None, overrides: Sequence[str] | None) -> dict[str, Any]:
    """sailor_train params from a JSON file (optional), then ``KEY=VALUE`` overrides (JSON values,
    else plain strings; a param whose type is a string keeps the text as given: ``job_name=2024``,
    and ``job_name=null`` unless the param may be null).

    Raises:
        ValueError: an unreadable file, not a JSON object, or an override without ``=``.
    """
    from sailor_tasks.request import train_param_schemas

    types = {
        name: spec.get("type") if isinstance(spec.get("type"), list) else [spec.get("type")]
        for name, spec in train_param_schemas().items()
    }
    string_params = {name for name, kinds in types.items() if "string" in kinds}
    nullable = {name for name, kinds in types.items() if "null" in kinds}
    params: dict[str, Any] = {}
    if path:
        try:
            with open(path) as f:
                params = json.load(f)
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot read params from {path}: {exc}") from exc
        if not isinstance(params, dict):
            raise ValueError(f"{path} must hold a JSON object of sailor_train params")
    for item in overrides or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set {item!r} is not KEY=VALUE (e.g. --set num_workers=8)")
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            params[key] = value
        if key in string_params and not isinstance(params[key], str):
            if params[key] is not None or key not in nullable:
                params[key] = value  # job_name=2024 (or null) is a name, not a number (or nothing)
    return params
