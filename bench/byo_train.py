"""Bring your own training code: the examples/ scripts through ``sailor_train`` on the local backend,
what the stages add around them, and what a gke run of one's own image and command renders.

- ``plain_example_identical`` / ``helper_example_identical``: ``examples/plain_ddp.py`` (no SAILOR
  import) and ``examples/with_helper.py`` (``sailor_tasks.runtime``), each run twice through every
  ``sailor_train`` stage (``testing.run_inline``): uninterrupted, and preempted with notice once
  (at ``--preempt-at``; recovered in another region). True when the preempted run saved on the
  notice (no step lost), resumed, and ends with the same checkpoint as the uninterrupted one, bit for
  bit (``diff_states``).
- ``orchestration_s``: for each script, the same command, workers, steps, dataset contents and
  environment run bare under ``python -m torch.distributed.run`` (the argv the local backend builds)
  and through every stage (validate, plan, place_data, provision, train, finalize, teardown),
  alternately (bare first in even rounds, staged first in odd ones, after one untimed bare run
  that reads torch and the script from disk), ``--rounds`` times; the median of (staged - bare)
  wall seconds over all pairs (``orchestration_runs`` has each pair with the staged run's seconds
  per stage). Target ≤ 10 s.
  Both sides include the training itself, whose speed varies by several seconds between identical
  runs on a loaded machine; ``outside_torchrun_s`` (the median of the staged wall time minus the
  torchrun process's own, from the attempt's ``launch.json``) is the stages' share without it.
- ``gke_pod_image_matches``: the pods ``sailor render`` (``airflow_glue.gcp.render_run``, no cloud
  call) builds for a gke run with ``image`` and ``command`` run that image, and that command under
  torchrun, in every container; false with ``gke_pod_image_reason`` when the render refuses or
  differs. ``gke_grace_s``: the ``terminationGracePeriodSeconds`` those pods carry (from a render of
  the built-in trainer when the own-command render is refused; ``gke_grace_from`` says which).
  Both null, with the reason, where Airflow and its providers are not installed (a GPU host that
  has only torch: the render is theirs).
- ``gpu``: ``bench/gpu_train.py``'s figures, or null with ``gpu_reason`` on a machine without a GPU.

Prints one JSON object as its last line.

Run: .venv/bin/python bench/byo_train.py [--steps 60] [--preempt-at 25] [--rounds 2]
"""

from __future__ import annotations

import argparse
import atexit
import importlib.util
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ("plain_ddp.py", "with_helper.py")
GKE_IMAGE = "us-docker.pkg.dev/acme-ml/train/byo-trainer:2026.11"
GKE_COMMAND = ["python", "train.py", "--epochs", "3"]


def bare(script: str, params: dict, settings: Any, source_uri: str, out: str) -> float:
    """Wall seconds of the local backend's torchrun command for ``script``, run by hand."""
    from sailor_tasks import storage
    from sailor_tasks.backends.base import TrainLaunch
    from sailor_tasks.backends.local import LocalBackend
    from sailor_tasks.model import Placement
    from sailor_tasks.train.config import TrainConfig

    config = TrainConfig(
        run_id=f"bare-{script}",
        model="tiny_gpt",
        data_uri=source_uri,
        output_uri=out,
        total_steps=params["total_steps"],
        checkpoint_every_steps=params["checkpoint_every_steps"],
        seed=params.get("seed", 0),
        command=list(params["command"]),
        env=dict(params["env"]),
    )
    here = Placement(
        run_id=config.run_id,
        cloud="local",
        region="localhost",
        zone="localhost",
        gpu_type="cpu",
        gpus_per_node=params["num_workers"],
        num_nodes=1,
        num_gpus=params["num_workers"],
        market="on_demand",
        instance_type="localhost",
        usd_per_hour=0.0,
    )
    launch = TrainLaunch(
        config.run_id, f"bare-{Path(out).name}", f"{out}/train_config.json", params["num_workers"], here
    )
    backend = LocalBackend(settings)
    cmd, env = backend.command(launch, config), backend.environment(launch, config)
    os.makedirs(settings.clusters_dir, exist_ok=True)
    started = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    last = storage.join(config.checkpoint_uri, f"step-{params['total_steps']:08d}", ".metadata")
    if not storage.exists(last):
        raise RuntimeError(f"the bare run of {script} did not reach step {params['total_steps']} ({last})")
    return wall


def identical(script: str, params: dict, preempt_at: int, ctx: Any, settings: Any, reference: dict) -> dict:
    """Run ``script`` preempted with notice once; compare its end with the uninterrupted ``reference``."""
    from sailor_tasks.ledger import Ledger
    from sailor_tasks.testing.run_inline import run_inline
    from sailor_tasks.train.checkpoint.dcp import CheckpointManager, diff_states

    def final_state(summary: dict) -> dict:
        root, step = summary["checkpoint_uri"].rsplit("/step-", 1)
        return CheckpointManager(root).load_all(int(step))

    run_id = f"pre-{script}"
    summary = run_inline(
        {**params, "inject_preemptions": [preempt_at], "recovery_strategy": "eager_next_region"}, run_id, ctx
    )
    ledger = Ledger(settings.ledger_url)
    preemptions, attempts = ledger.preemptions(run_id), ledger.attempts(run_id)
    diffs = diff_states(final_state(reference), final_state(summary))
    ok = (
        not diffs
        and summary["steps"] == params["total_steps"]
        and len(preemptions) == 1
        and preemptions[0]["noticed"]
        and preemptions[0]["steps_lost"] == 0
        and [a["outcome"] for a in attempts] == ["preempted", "completed"]
    )
    return {
        "identical": ok,
        "differing_entries": diffs[:5],
        "preempted_at_step": preemptions[0]["step"] if preemptions else None,
        "steps_lost": preemptions[0]["steps_lost"] if preemptions else None,
        "regions": [a["region"] for a in attempts],
    }


def runs_command(argv: list[str], command: list[str]) -> bool:
    """``argv`` (a container's command + args) runs ``command``: its argv appears in it whole, or
    after the interpreter when torchrun starts the script (``python x.py`` → ``torchrun ... x.py``)."""
    wanted = [command]
    if command and Path(command[0]).name.startswith("python"):
        wanted.append(command[1:])
    n = len(argv)
    return any(w and any(argv[i : i + len(w)] == w for i in range(n - len(w) + 1)) for w in wanted)


def gke_render() -> dict:
    """Render gke pods for a run with ``image`` and ``command``; check them."""
    if importlib.util.find_spec("airflow") is None:  # the render is the Google/Kubernetes providers'
        reason = "not rendered: Airflow is not installed here"
        return {"gke_pod_image_matches": None, "gke_pod_image_reason": reason, "gke_grace_s": None}
    from sailor_tasks.airflow_glue.gcp import render_run
    from sailor_tasks.settings import Settings

    settings = Settings.from_env()
    base = {"job_name": "byo-render", "team": "bench", "num_workers": 2, "total_steps": 100}
    out: dict[str, Any] = {"gke_pod_image_matches": False, "gke_pod_image_reason": None}
    pods: list[dict] = []
    try:
        rendered = render_run({**base, "image": GKE_IMAGE, "command": GKE_COMMAND}, settings)
        pods = [m for m in rendered["manifests"] if m.get("kind") == "Pod"]
        containers = [c for p in pods for c in p["spec"]["containers"]]
        wrong = [
            f"{c['name']}: image {c.get('image')}, argv {[*(c.get('command') or []), *(c.get('args') or [])]}"
            for c in containers
            if c.get("image") != GKE_IMAGE
            or not runs_command([*(c.get("command") or []), *(c.get("args") or [])], GKE_COMMAND)
        ]
        if not pods:
            out["gke_pod_image_reason"] = "the render has no pods"
        elif wrong:
            out["gke_pod_image_reason"] = f"containers not running {GKE_IMAGE} {GKE_COMMAND}: {wrong}"
        else:
            out["gke_pod_image_matches"] = True
        out["gke_grace_from"] = "own image and command"
    except Exception as exc:  # noqa: BLE001 - the refusal is the finding
        out["gke_pod_image_reason"] = f"render refused image/command: {type(exc).__name__}: {exc}"
        rendered = render_run(base, settings)
        pods = [m for m in rendered["manifests"] if m.get("kind") == "Pod"]
        out["gke_grace_from"] = "built-in trainer (own command refused)"
    graces = {p["spec"].get("terminationGracePeriodSeconds") for p in pods}
    out["gke_grace_s"] = graces.pop() if len(graces) == 1 else sorted(graces, key=str)
    out["gke_pods"] = len(pods)
    return out


def gpu_figures() -> dict:
    """bench/gpu_train.py's last line: {"gpu": {...}} or {"gpu": null, "reason": ...}."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_train.py")], capture_output=True, text=True, timeout=1800
    )
    if done.returncode != 0:
        return {"gpu": None, "gpu_reason": f"gpu_train.py failed: {done.stderr.strip()[-500:]}"}
    last = json.loads(done.stdout.strip().splitlines()[-1])
    return {"gpu": last["gpu"], "gpu_reason": last.get("reason")}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60, help="total_steps of every run")
    parser.add_argument("--every", type=int, default=10, help="CHECKPOINT_EVERY of the examples")
    parser.add_argument("--preempt-at", type=int, default=25, help="step of the noticed preemption")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2, help="bare/staged pairs per script")
    args = parser.parse_args()
    if not 0 < args.preempt_at < args.steps:
        parser.error(f"--preempt-at {args.preempt_at} must be in (0, --steps {args.steps})")
    logging.basicConfig(level=logging.WARNING)

    state = tempfile.mkdtemp(prefix="sailor-bench-byo-")
    atexit.register(shutil.rmtree, state, ignore_errors=True)
    os.environ["SAILOR_STATE_DIR"] = state
    os.environ.pop("SAILOR_LEDGER_URL", None)
    os.environ.pop("SAILOR_BUCKET_TEMPLATE", None)
    os.environ.pop("SAILOR_COMMAND_ROOTS", None)  # the default: the project's examples/
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    from sailor_tasks import paths, storage
    from sailor_tasks.data.demo import DEMO_DATASET, write_demo_dataset
    from sailor_tasks.settings import Settings
    from sailor_tasks.stages import StageContext
    from sailor_tasks.testing.run_inline import run_inline

    settings = Settings.from_env()
    source = storage.resolve(DEMO_DATASET, settings)
    write_demo_dataset(source)
    ctx = StageContext(settings)

    result: dict[str, Any] = {}
    overheads: dict[str, list[dict]] = {}
    for script in SCRIPTS:
        params = {
            "job_name": "bench-byo",
            "team": "bench",
            "num_workers": args.workers,
            "total_steps": args.steps,
            "checkpoint_every_steps": args.every,
            "preemption_notice_s": 30,
            "dataset_uri": DEMO_DATASET,
            "command": ["python", script],
            "env": {"CHECKPOINT_EVERY": str(args.every)},
        }
        pairs, reference = [], None
        # Untimed: the first run of a script reads torch and the script from disk, whichever side
        # it is on.
        bare(script, params, settings, source, f"file://{state}/bare/{script}-warm-up")
        for i in range(args.rounds):
            # Sides alternate (bare first, then staged first, ...): neither is always the later one.
            times: dict[str, float] = {}
            for side in ("bare", "staged") if i % 2 == 0 else ("staged", "bare"):
                if side == "bare":
                    times[side] = bare(script, params, settings, source, f"file://{state}/bare/{script}-{i}")
                else:
                    started = time.perf_counter()
                    summary = run_inline(params, f"ref-{script}-{i}", ctx)
                    times[side] = time.perf_counter() - started
            bare_s, staged_s = times["bare"], times["staged"]
            reference = reference or summary
            stages = {
                t["stage"]: round(t["seconds"], 2) for t in ctx.ledger.stage_timings(f"ref-{script}-{i}")
            }
            run_folder = summary["checkpoint_uri"].rsplit("/checkpoints/", 1)[0]
            launch = storage.read_json(paths.launch_report_uri(run_folder))
            pairs.append(
                {
                    "bare_s": round(bare_s, 2),
                    "staged_s": round(staged_s, 2),
                    "torchrun_s": round(launch["ended_at"] - launch["started_at"], 2),
                    "stage_s": stages,
                }
            )
        overheads[script] = pairs
        key = "plain_example_identical" if script == "plain_ddp.py" else "helper_example_identical"
        check = identical(script, params, args.preempt_at, ctx, settings, reference)
        result[key] = check.pop("identical")
        result[f"{Path(script).stem}_preempted"] = check
        print(f"{script}: identical {result[key]}, bare vs staged {pairs}", file=sys.stderr)

    diffs = [p["staged_s"] - p["bare_s"] for pairs in overheads.values() for p in pairs]
    result["orchestration_s"] = round(statistics.median(diffs), 2)
    outside = [p["staged_s"] - p["torchrun_s"] for pairs in overheads.values() for p in pairs]
    result["outside_torchrun_s"] = round(statistics.median(outside), 2)
    result["orchestration_runs"] = overheads
    result.update(gke_render())
    result.update(gpu_figures())
    result.update({"steps": args.steps, "workers": args.workers, "preempt_at": args.preempt_at})
    print(json.dumps(result))


if __name__ == "__main__":
    main()
