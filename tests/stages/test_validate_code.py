"""``validate`` confines a local run's own command to the allowed folders: a bad one is rejected
naming ``command`` and nothing is reserved, copied or provisioned."""

from __future__ import annotations

import os

import pytest

from sailor_tasks import stages
from sailor_tasks.errors import InvalidRequestErrors
from sailor_tasks.stages import StageContext


@pytest.fixture
def code_ctx(tmp_path, settings, monkeypatch):
    roots = tmp_path / "code"
    roots.mkdir()
    (roots / "train.py").write_text("print('training')\n")
    monkeypatch.setenv("SAILOR_COMMAND_ROOTS", str(roots))
    from sailor_tasks.settings import Settings

    return StageContext(Settings.from_env())


def test_command_under_the_allowed_roots_is_validated(code_ctx, demo_dataset):
    request = stages.validate({"dataset_uri": demo_dataset, "command": ["python", "train.py"]}, "ok", code_ctx)
    assert list(request["command"]) == ["python", "train.py"]


@pytest.mark.parametrize(
    "command", [["python", "/etc/passwd"], ["sh", "-c", "id"], ["python", "missing.py"], ["python", "-c", "1"]]
)
def test_bad_local_command_is_rejected_and_changes_nothing(code_ctx, demo_dataset, command):
    buckets = os.path.join(code_ctx.settings.state_dir, "buckets")
    before = sorted(os.walk(buckets))
    with pytest.raises(InvalidRequestErrors) as info:
        stages.validate({"dataset_uri": demo_dataset, "command": command}, "bad", code_ctx)
    assert [e.field for e in info.value.errors] == ["command"]
    assert "command=" in str(info.value)
    run = code_ctx.ledger.get_run("bad")
    assert run["status"] == "rejected" and "command" in run["error"]
    assert code_ctx.ledger.placements("bad") == [] and code_ctx.ledger.live_reservations() == []
    assert sorted(os.walk(buckets)) == before
    assert not os.path.isdir(code_ctx.settings.clusters_dir) or os.listdir(code_ctx.settings.clusters_dir) == []
