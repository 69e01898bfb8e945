"""The trainer's progress file: a tiny JSON a backend on the same machine polls (torch-free).

Rank 0 rewrites it atomically after every step when ``SAILOR_PROGRESS_FILE`` is set (the local
backend sets it), so step-triggered preemption injection and recovery timing need no log parsing.
"""

from __future__ import annotations

import json
import os
from typing import Any

PROGRESS_ENV = "SAILOR_PROGRESS_FILE"


def write_progress(path: str, **fields: Any) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(fields, f)
    os.replace(tmp, path)


def read_progress(path: str) -> dict[str, Any]:
    """The last progress written, or {} when none (not started yet, or no progress file)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}
