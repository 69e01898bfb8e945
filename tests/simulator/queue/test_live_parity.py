"""The live queue and the queue simulator take the same decisions on the same inputs: the
simulator's event sequence (arrivals, ends) replayed through the live stages on a real SQLite
ledger (``plan`` at each arrival, ``teardown`` at each end) admits the same runs in the same order.

Same inputs: 4 T4 GPUs (one zone live; the simulator's spot zone, no on-demand), the same runs
(``tiny_gpt`` is Gavel's ``LM (batch size 20)``, its GPUs the scale factor), teams, priorities and
steps, arriving in the same order at the same times: the live stages read the simulator's clock
(``ftf`` weighs each run's time since its arrival, so the wall clock of a slow test run could
tip a close decision).
"""

from __future__ import annotations

import datetime as dt
import importlib

import pytest

from sailor_tasks import stages
from sailor_tasks.catalog import load_catalog
from sailor_tasks.catalog.throughput import MODEL_JOB_TYPES, load_packaged
from sailor_tasks.errors import RunQueuedError
from sailor_tasks.settings import Settings
from sailor_tasks.simulator.queue import QueueJob, QueueSimConfig, simulate_queue

ZONE = "us-central1-a"
GPUS = 4
# (run, team, GPUs, hours of work on T4, priority): distinct lengths, so no two runs end at once.
RUNS = (
    ("a-1", "a", 2, 3.1, "normal"),
    ("a-2", "a", 2, 2.3, "normal"),
    ("a-3", "a", 2, 1.7, "normal"),
    ("a-4", "a", 1, 2.9, "normal"),
    ("b-1", "b", 2, 1.3, "normal"),
    ("a-5", "a", 1, 0.7, "normal"),
    ("b-2", "b", 1, 2.6, "low"),
    ("c-1", "c", 2, 1.1, "high"),
    ("b-3", "b", 4, 0.9, "normal"),
)


def sim_jobs():
    key = MODEL_JOB_TYPES["tiny_gpt"][0]
    table = load_packaged()
    out = []
    for i, (run_id, team, gpus, hours, priority) in enumerate(RUNS):
        steps = round(table.throughput((key, gpus), "T4") * hours * 3600)
        out.append(QueueJob(run_id, team, (key, gpus), steps, arrival_s=60.0 * i, priority=priority))
    return table, out


@pytest.mark.parametrize("policy", ["las", "fifo", "ftf"])
def test_the_live_pass_and_the_simulator_admit_the_same_runs_in_the_same_order(
    settings, demo_dataset, tmp_path, monkeypatch, policy
):
    table, jobs = sim_jobs()
    sim = simulate_queue(jobs, table, QueueSimConfig({"T4": GPUS}, {}, policy))
    assert all(r.state == "finished" for r in sim.runs)

    monkeypatch.setenv("SAILOR_QUEUE_POLICY", policy)
    ctx = stages.StageContext(Settings.from_env())
    supply = tmp_path / "supply.yaml"
    supply.write_text(
        f"version: 1\ndefaults:\n  capacity_gpus: {{}}\n  preemption_rate_per_hour: {{T4: 0.0}}\nzones:\n  {ZONE}:\n    T4: {{capacity_gpus: {GPUS}}}\n"
    )
    ctx.__dict__["catalog"] = load_catalog(None, str(supply))
    requests = {
        job.run_id: stages.validate(
            {
                "dataset_uri": demo_dataset,
                "num_workers": job.gpus,
                "gpu_type": "T4",
                "team": job.team,
                "priority": job.priority,
                "total_steps": int(job.total_steps),
                "checkpoint_every_steps": 50,
            },
            job.run_id,
            ctx,
        )
        for job in jobs
    }
    # The simulator's events in time order (an end frees capacity before an arrival at that time).
    events = sorted(
        [(r.arrival_s, 1, r.run_id) for r in sim.runs] + [(r.end_s, 0, r.run_id) for r in sim.runs]
    )
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    clock = [start]
    for module in ("ledger.store", "stages.queueing", "stages.context"):
        monkeypatch.setattr(importlib.import_module(f"sailor_tasks.{module}"), "utcnow", lambda: clock[0])
    live = []
    for at, kind, run_id in events:
        clock[0] = start + dt.timedelta(seconds=at)
        if kind == 1:
            try:
                stages.plan(requests[run_id], run_id, ctx)
                live.append(run_id)  # it fitted with nobody waiting
            except RunQueuedError:
                pass
        else:
            live += stages.teardown(run_id, ctx)["admitted"]
    assert live == sim.admitted
    assert sorted(live) == sorted(j.run_id for j in jobs)
