"""A new user's first hour on a real Airflow stack, scripted through the ``sailor`` command: submit
to a paused DAG, then with --unpause; show the run; read its logs from the folder and the REST API;
cancel a long run and count the processes it left; ``sailor check`` of the local backend, and of gke
with no GCP setup. For bench/first_hour.py and the e2e tests."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from typing import Any

import psutil

from sailor_tasks.backends.local import run_processes
from sailor_tasks.ledger import Ledger
from sailor_tasks.model import run_key
from sailor_tasks.testing.airflow_stack import PASSWORD, AirflowStack

TINY = {
    "job_name": "first-hour",
    "team": "qa",
    "model": "tiny_gpt",
    "num_workers": 2,
    "total_steps": 40,
    "checkpoint_every_steps": 20,
    "batch_size": 8,
}
"""A run that trains in seconds on two CPU processes."""

LONG = {**TINY, "job_name": "first-hour-cancel", "total_steps": 1_000_000, "checkpoint_every_steps": 100}
"""A run that trains until it is cancelled."""

STEP_LINE = re.compile(r"step \d+/\d+ loss \d")


def sailor(stack: AirflowStack, *args: str, timeout_s: float = 300.0) -> subprocess.CompletedProcess:
    """The ``sailor`` command (this checkout's) with the stack's settings: its state folder and
    AIRFLOW_HOME (so ``logs`` reads the stack's log folder)."""
    return subprocess.run(
        [sys.executable, "-m", "sailor_tasks.cli", *args],
        env=stack.env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def connection(stack: AirflowStack) -> list[str]:
    return ["--airflow-url", stack.url, "--password", PASSWORD]


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    """The processes that still run (a zombie runs no more)."""
    left = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                left.append(p)
        except psutil.NoSuchProcess:
            pass
    return left


def wait_for_workers(key: str, workers: int, timeout_s: float = 300.0) -> list[psutil.Process]:
    """torchrun of run ``key`` and its ``workers`` workers, once all are up."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for agent in run_processes(key):
            try:
                if "torch.distributed.run" in " ".join(agent.cmdline()):
                    children = agent.children(recursive=True)
                    if len(children) >= workers:
                        return [agent, *children]
            except psutil.NoSuchProcess:
                continue
        time.sleep(0.5)
    raise TimeoutError(f"run {key}: torchrun and {workers} workers not up after {timeout_s:.0f} s")


def _dag_runs(stack: AirflowStack) -> int:
    return stack.client().request("GET", "/api/v2/dags/sailor_train/dagRuns")["total_entries"]


def submit_to_paused_dag(stack: AirflowStack, run_timeout_s: float = 900.0) -> dict[str, Any]:
    """Submit to the paused DAG (refused, saying how to unpause), then with --unpause (runs)."""
    client = stack.client()
    client.pause("sailor_train")
    params = stack.root / "first-hour.json"
    params.write_text(json.dumps(TINY))
    before = _dag_runs(stack)
    refused = sailor(stack, "submit", str(params), *connection(stack), "--no-wait")
    triggered_while_paused = _dag_runs(stack) - before
    done = sailor(
        stack, "submit", str(params), *connection(stack), "--unpause", "--poll", "2", timeout_s=run_timeout_s
    )
    run_id, _, state = done.stdout.strip().partition("\n")
    ok = (
        refused.returncode == 1
        and "is paused" in refused.stderr
        and "--unpause" in refused.stderr
        and triggered_while_paused == 0
        and done.returncode == 0
        and state.strip() == "success"
        and not client.get_dag("sailor_train")["is_paused"]
        and f"sailor cancel {run_id}" in done.stderr
    )
    return {
        "ok": ok,
        "run_id": run_id,
        "refused_exit": refused.returncode,
        "refused_message": refused.stderr.strip().splitlines()[-1:],
        "triggered_while_paused": triggered_while_paused,
        "unpaused_exit": done.returncode,
        "state": state.strip(),
        "stderr_tail": done.stderr[-2000:] if done.returncode else "",
    }


def show(stack: AirflowStack, run_id: str) -> dict[str, Any]:
    as_json = sailor(stack, "show", run_id, "--json")
    as_text = sailor(stack, "show", run_id)
    r = json.loads(as_json.stdout) if as_json.returncode == 0 else {}
    ok = bool(
        r
        and r["run"]["status"] == "success"
        and r["placements"]
        and r["placements"][0]["explanation"]
        and r["attempts"]
        and all(a["market"] and a["zone"] and a["why"] for a in r["attempts"])
        and r["data"]
        and r["checkpoints"]
        and r["summary_md"]
        and as_text.returncode == 0
        and "why  chose" in as_text.stdout
    )
    return {"ok": ok, "exit": as_json.returncode, "stderr": as_json.stderr[-1000:]}


def logs(stack: AirflowStack, run_id: str) -> dict[str, Any]:
    local = sailor(stack, "logs", run_id, "--task", "train")
    api = sailor(stack, "logs", run_id, "--task", "train", *connection(stack))
    steps = {name: len(STEP_LINE.findall(p.stdout)) for name, p in (("folder", local), ("api", api))}
    ok = local.returncode == 0 and api.returncode == 0 and min(steps.values()) > 0
    return {"ok": ok, "step_lines": steps, "stderr": (local.stderr + api.stderr)[-1000:]}


def cancel(stack: AirflowStack) -> dict[str, Any]:
    """Start a long run, wait for its workers, follow its logs, ``sailor cancel`` it; count what is left."""
    run_id = stack.client().trigger("sailor_train", LONG)["dag_run_id"]
    key = run_key(run_id)
    tree = wait_for_workers(key, LONG["num_workers"])
    follow = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sailor_tasks.cli",
            "logs",
            run_id,
            "--follow",
            "--poll",
            "1",
            *connection(stack),
        ],
        env=stack.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    started = time.monotonic()
    done = sailor(stack, "cancel", run_id, *connection(stack), "--timeout", "300", timeout_s=400)
    cancel_s = time.monotonic() - started
    try:
        followed, _ = follow.communicate(timeout=60)  # --follow ends by itself when the run has ended
        follow_ended = follow.returncode == 0
    except subprocess.TimeoutExpired:
        follow.kill()
        followed, _ = follow.communicate()
        follow_ended = False
    left = {p.pid for p in alive(tree)} | {p.pid for p in run_processes(key)}
    ledger = Ledger(stack.settings().ledger_url)
    run = ledger.get_run(run_id) or {}
    return {
        "run_id": run_id,
        "exit": done.returncode,
        "state": done.stdout.strip(),
        "seconds": round(cancel_s, 1),
        "processes_before": len(tree),
        "leftover_processes": len(left),
        "ledger_status": run.get("status"),
        "reservation_released": all(r.run_id != run_id for r in ledger.live_reservations()),
        "follow_ended": follow_ended,
        "followed_train_log": "==> train (try 1) <==" in followed and "launching:" in followed,
        "stderr": done.stderr[-1000:],
    }


UNCONFIGURED_GCP = (
    "SAILOR_GCP_PROJECT",
    "SAILOR_GCP_CONN_ID",
    "SAILOR_BUCKET_TEMPLATE",
    "SAILOR_GKE_IMAGE",
    "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GOOGLE_CLOUD_PROJECT",
    "CLOUDSDK_CONFIG",
)
"""What makes a GCP setup: left out of the environment for ``check_gke``."""


def _check(env: dict[str, str], backend: str, timeout_s: float = 600.0) -> tuple[int, dict[str, Any]]:
    proc = subprocess.run(
        [sys.executable, "-m", "sailor_tasks.cli", "check", "--backend", backend, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    try:
        return proc.returncode, json.loads(proc.stdout)
    except ValueError:
        return proc.returncode, {"checks": [], "stdout": proc.stdout[-1000:], "stderr": proc.stderr[-2000:]}


def check_local(env: dict[str, str]) -> dict[str, Any]:
    """``sailor check --backend local`` in ``env``: every prerequisite holds and the exit status is 0."""
    code, out = _check(env, "local")
    checks = out.get("checks", [])
    ok = code == 0 and bool(checks) and all(c["ok"] for c in checks)
    return {"ok": ok, "exit": code, "failed": [c for c in checks if not c["ok"]], **_errors(out)}


def check_gke(env: dict[str, str]) -> dict[str, Any]:
    """``sailor check --backend gke`` with no GCP setup (``UNCONFIGURED_GCP`` left out of ``env``,
    a fresh ``CLOUDSDK_CONFIG`` so no gcloud login counts): the prerequisites it reports failing,
    each with a fix, and the exit status (1)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="sailor-no-gcloud-") as gcloud:
        bare = {k: v for k, v in env.items() if k not in UNCONFIGURED_GCP} | {"CLOUDSDK_CONFIG": gcloud}
        code, out = _check(bare, "gke")
    checks = out.get("checks", [])
    reported = [c for c in checks if not c["ok"] and c["fix"]]
    return {
        "reports": len(reported),
        "exit": code,
        "names": [c["name"] for c in reported],
        "all_have_a_fix": all(c["fix"] for c in checks if not c["ok"]),
        **_errors(out),
    }


def _errors(out: dict[str, Any]) -> dict[str, Any]:
    return {k: out[k] for k in ("stdout", "stderr") if k in out}


def first_hour(stack: AirflowStack) -> dict[str, Any]:
    """Every check that needs the stack, in a new user's order (bench/first_hour.py adds
    ``flags_without_help``, which needs only the parser)."""
    submitted = submit_to_paused_dag(stack)
    run_id = submitted["run_id"]
    shown = show(stack, run_id) if submitted["state"] == "success" else {"ok": False}
    logged = logs(stack, run_id) if submitted["state"] == "success" else {"ok": False}
    cancelled = cancel(stack)
    local, gke = check_local(stack.env), check_gke(stack.env)
    return {
        "show_ok": shown["ok"],
        "logs_ok": logged["ok"],
        "cancel_leftover_processes": cancelled["leftover_processes"],
        "check_local_ok": local["ok"],
        "check_gke_reports": gke["reports"],
        "submit_paused_dag_ok": submitted["ok"],
        "details": {
            "submit": submitted,
            "show": shown,
            "logs": logged,
            "cancel": cancelled,
            "check_local": local,
            "check_gke": gke,
        },
    }
