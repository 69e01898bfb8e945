"""``sailor demo`` and ``sailor demo-data``: the local end-to-end demo through Airflow and its summary."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

from sailor_tasks.errors import ExitCode
from sailor_tasks.settings import SOURCE_BUCKET, Settings

DEMO_PARAMS = {
    "job_name": "demo-lm",
    "team": "research",
    "model": "tiny_gpt",
    "num_workers": 2,
    "total_steps": 300,
    "checkpoint_every_steps": 50,
    "market": "auto",
    "max_usd_per_hour": 20.0,
    "seed": 0,
    # Spot resilience: one preemption with notice mid-training, recovered in the next region.
    "inject_preemptions": [150],
    "recovery_strategy": "eager_next_region",
}


def add_data_parser(sub: Any) -> None:
    """Register ``demo-data`` (separate from ``demo``: ``sailor --help`` lists them apart)."""
    p = sub.add_parser("demo-data", help=f"generate the demo dataset in the '{SOURCE_BUCKET}' bucket")
    p.set_defaults(func=cmd_demo_data)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("demo", help="run sailor_train and sailor_rebalance through Airflow, then summarise")
    p.add_argument("--conf", help="JSON object overriding the demo params")
    p.set_defaults(func=cmd_demo)


def ensure_demo_dataset(settings: Settings) -> str:
    """Create the demo corpus in the source bucket unless a sealed copy is already there."""
    from sailor_tasks import storage
    from sailor_tasks.data.demo import DEMO_DATASET, write_demo_dataset
    from sailor_tasks.data.manifest import read_manifest

    root = storage.resolve(DEMO_DATASET, settings)
    manifest = read_manifest(root)
    if manifest is None:
        manifest = write_demo_dataset(root)
        print(
            f"generated demo dataset: {len(manifest.files)} files, {manifest.total_bytes / 1e6:.1f} MB at {root}"
        )
    return root


def cmd_demo_data(args: argparse.Namespace) -> int:
    ensure_demo_dataset(Settings.from_env())
    return 0


def _airflow(*argv: str) -> int:
    airflow = os.path.join(os.path.dirname(sys.executable), "airflow")
    print(f"$ airflow {' '.join(argv)}", flush=True)
    return subprocess.call([airflow, *argv])


def cmd_demo(args: argparse.Namespace) -> int:
    from sailor_tasks.catalog import load_catalog
    from sailor_tasks.errors import InvalidRequestError
    from sailor_tasks.ledger import Ledger
    from sailor_tasks.request import from_params

    try:
        conf = json.loads(args.conf) if args.conf else {}
    except json.JSONDecodeError as exc:
        print(f"error: --conf {args.conf!r} is not JSON: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    if not isinstance(conf, dict):
        print(f"error: --conf {args.conf!r} must be a JSON object of sailor_train params", file=sys.stderr)
        return ExitCode.BAD_INPUT
    params = {**DEMO_PARAMS, **conf}
    try:  # the checks validate runs (minus the dataset lookup): refuse bad params before any setup
        from_params(params, load_catalog())
    except InvalidRequestError as exc:
        print(f"error: --conf: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    settings = Settings.from_env()
    ensure_demo_dataset(settings)
    if _airflow("dags", "test", "sailor_train", "-c", json.dumps(params)) != 0:
        print("sailor_train failed; see the log above", file=sys.stderr)
        return 1
    if _airflow("dags", "test", "sailor_rebalance") != 0:
        print("sailor_rebalance failed; see the log above", file=sys.stderr)
        return 1
    ledger = Ledger(settings.ledger_url)
    runs = [r for r in ledger.list_runs(limit=20) if r["job_name"] == params["job_name"]]
    if not runs or runs[0]["status"] != "success":
        print(
            f"the demo run did not succeed: {runs[0]['status'] if runs else 'no run recorded'}",
            file=sys.stderr,
        )
        return 1
    print()
    print(demo_summary(ledger, runs[0]["run_id"], settings))
    return 0


def demo_summary(ledger: Any, run_id: str, settings: Settings) -> str:
    run = ledger.get_run(run_id)
    placement = ledger.placements(run_id, limit=1)[0]
    assignment = ledger.latest_assignment()
    replicas = ledger.replicas([run["dataset_uri"]])
    lines = [
        "=" * 78,
        f"SAILOR demo: run {run_id} — {run['status'].upper()}",
        "=" * 78,
        f"Placed in    {run['region']} / {run['zone']}: {run['num_gpus']}x {run['gpu_type']} ({run['market']}) "
        f"at ${run['usd_per_hour']:.2f}/h",
        *(f"  why        {line}" for line in placement["explanation"]),
        f"Data placed  {run['dataset_uri']} -> regions {', '.join(replicas.get(run['dataset_uri'], ()))}",
        f"Training     {run['steps']} steps of {run['model']}; eval loss {run['initial_loss']:.3f} -> "
        f"{run['final_loss']:.3f}",
        f"Checkpoint   {run['checkpoint_uri']}",
        *recovery_lines(ledger, run_id),
        f"Est. cost    ${run['usd_estimate']:.4f} (price x training wall time on the local backend)",
        f"Rebalance    assignment v{assignment.version if assignment else '-'} published "
        f"({len(assignment.shares) if assignment else 0} teams)",
        f"State        {settings.state_dir} (ledger {settings.ledger_url_redacted})",
        "",
        f"See the run:      .venv/bin/sailor show {run_id}",
        "List the runs:    .venv/bin/sailor runs",
        "Start Airflow:    make airflow (UI on http://localhost:8080, user admin, password admin); then",
        "                  .venv/bin/sailor submit params.json --unpause, and follow it with",
        "                  .venv/bin/sailor logs RUN_ID --follow --airflow-url http://localhost:8080",
    ]
    return "\n".join(lines)


def recovery_lines(ledger: Any, run_id: str) -> list[str]:
    """The run's attempts and preemptions, for the demo summary (empty when never preempted)."""
    attempts = ledger.attempts(run_id) if hasattr(ledger, "attempts") else []
    preemptions = {p["attempt"]: p for p in ledger.preemptions(run_id)}
    if not preemptions:
        return []
    run = ledger.get_run(run_id)
    req = run.get("request") or {}
    strategy = req.get("recovery_strategy") or req.get("strategy", "?")
    lines = [f"Recovery     {len(preemptions)} preemption(s), {len(attempts)} attempts (strategy {strategy})"]
    for a in attempts:
        where = f"attempt {a['attempt']} in {a['region']}/{a['zone']}"
        start = (
            f"from step {a['resumed_from_step']}" if a["resumed_from_step"] is not None else "from scratch"
        )
        p = preemptions.get(a["attempt"])
        if p:
            rec = f", back to training in {p['recovery_s']:.1f} s" if p["recovery_s"] is not None else ""
            end = (
                f"preempted {'with' if p['noticed'] else 'without'} notice at step {p['step']}: "
                f"{'?' if p['steps_lost'] is None else p['steps_lost']} steps lost{rec}"
            )
        else:
            end = f"{a['outcome']} at step {a['step']}"
        lines.append(f"  {where}: started {start}, {end}")
    return lines
