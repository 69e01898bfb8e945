"""A malformed supply file (SAILOR_SUPPLY_FILE) must be refused with a clear error naming the bad
entry (``CatalogError``, which the CLI and the stages report), never a traceback or a silently
accepted negative capacity."""

from __future__ import annotations

import pytest

from sailor_tasks.catalog import load_catalog
from sailor_tasks.errors import CatalogError

GOOD_HEAD = "version: 1\ndefaults: {capacity_gpus: {T4: 8}, preemption_rate_per_hour: {T4: 0.1}}\n"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (
            GOOD_HEAD + "zones:\n  us-east1-c: {T4: {capacity_gpus: -3}}\n",
            "zones.us-east1-c.T4.capacity_gpus=-3",
        ),
        (
            GOOD_HEAD + "zones:\n  us-east1-c: {T4: {capacity_gpus: lots}}\n",
            "zones.us-east1-c.T4.capacity_gpus='lots'",
        ),
        (
            GOOD_HEAD + "zones:\n  us-east1-c: {T4: {preemption_rate_per_hour: -1}}\n",
            "zones.us-east1-c.T4.preemption_rate_per_hour=-1",
        ),
        (GOOD_HEAD + "zones:\n  us-east1-c: [T4]\n", "zones.us-east1-c"),
        ("version: 1\ndefaults: {capacity_gpus: {T4: 8\n", "supply"),  # YAML syntax error
        ("- 1\n", "supply"),  # not a mapping
    ],
)
def test_a_malformed_supply_file_is_a_catalog_error_naming_the_entry(tmp_path, text, fragment):
    path = tmp_path / "supply.yaml"
    path.write_text(text)
    load_catalog.cache_clear()
    try:
        with pytest.raises(CatalogError) as info:
            load_catalog(supply_path=str(path))
    finally:
        load_catalog.cache_clear()
    assert fragment in str(info.value)
