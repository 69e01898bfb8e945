"""The example training scripts run through every ``sailor_train`` stage on the local backend under
the run contract: preempted with notice in the middle and moved to another region, each ends with
parameters bit-identical to its uninterrupted run."""

from __future__ import annotations

import pytest

from sailor_tasks import storage
from sailor_tasks.ledger import Ledger
from sailor_tasks.testing.run_inline import run_inline
from sailor_tasks.train.checkpoint.dcp import CheckpointManager, diff_states
from sailor_tasks.train.checkpoint.store import MARKER

pytestmark = pytest.mark.slow

BASE = {
    "job_name": "own-code",
    "team": "qa",
    "num_workers": 2,
    "total_steps": 24,
    "checkpoint_every_steps": 6,
    "preemption_notice_s": 30,
    "env": {"CHECKPOINT_EVERY": "6"},
}


def final_state(summary: dict) -> dict:
    root, step = summary["checkpoint_uri"].rsplit("/step-", 1)
    return CheckpointManager(root).load_all(int(step))


@pytest.mark.parametrize("script", ["plain_ddp.py", "with_helper.py"])
def test_example_preempted_with_notice_ends_bit_identical_to_an_uninterrupted_run(
    settings, ctx, demo_dataset, script
):
    params = {**BASE, "dataset_uri": demo_dataset, "command": ["python", script]}
    reference = run_inline(params, f"ref-{script}", ctx)
    summary = run_inline(
        {**params, "inject_preemptions": [9], "recovery_strategy": "eager_next_region"}, f"pre-{script}", ctx
    )
    assert reference["steps"] == summary["steps"] == 24
    assert summary["checkpoint_uri"].endswith("/step-00000024")
    assert storage.exists(storage.join(summary["checkpoint_uri"], MARKER))  # SAILOR verifies it
    ref_state, state = final_state(reference), final_state(summary)
    assert diff_states(ref_state, state) == [] and state["step"] == 24

    ledger = Ledger(settings.ledger_url)
    (preemption,) = ledger.preemptions(f"pre-{script}")
    assert preemption["noticed"] and preemption["steps_lost"] == 0  # saved on the notice
    attempts = ledger.attempts(f"pre-{script}")
    assert [a["outcome"] for a in attempts] == ["preempted", "completed"]
    assert attempts[1]["region"] != attempts[0]["region"]  # the checkpoint moved, verified, resumed
    assert attempts[1]["resumed_from_step"] == preemption["step"] >= 9
