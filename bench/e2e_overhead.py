"""Airflow's overhead on a training run: the same small run through the real scheduler vs bare torchrun.

Starts the real services (PostgreSQL, api-server, scheduler, dag-processor, triggerer; see
``sailor_tasks.testing.airflow_stack``), calibrates the number of steps so that training alone takes about
``--target-s`` seconds, triggers ``sailor_train`` through the REST API and measures the dag run from
queued to done (all seven tasks: validate, plan, place_data, provision, train, finalize, teardown).
Then it runs the very ``torchrun`` command the local backend ran, with the run's own
``train_config.json`` (only the output folder changed, so it starts from step 0), and times it.

Prints one JSON object as its last line: ``orchestration_s`` (the headline: dag run minus bare
torchrun of the same work, in seconds, which does not depend on the training length),
``train_dag_wall_s``, ``bare_training_wall_s``, ``overhead_ratio`` (their ratio, which does: the
same orchestration seconds are a smaller share of a longer run), ``outside_train_task_s`` (dag run
minus the train task: the stages around training and the scheduler's gaps between tasks) and
``train_task_over_bare_s`` (train task minus bare torchrun: the task's own start-up and the
training slowed by the Airflow services sharing the CPU).

Run: .venv/bin/python bench/e2e_overhead.py [--target-s 120] [--steps N]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sailor_tasks import paths, storage
from sailor_tasks.backends.base import TrainLaunch
from sailor_tasks.backends.local import LocalBackend
from sailor_tasks.data.demo import DEMO_DATASET, write_demo_dataset
from sailor_tasks.ledger import Ledger
from sailor_tasks.model import Placement
from sailor_tasks.testing.airflow_stack import AirflowStack
from sailor_tasks.train.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
PARAMS = {
    "job_name": "bench-overhead",
    "team": "bench",
    "model": "tiny_gpt",
    "num_workers": 2,
    "batch_size": 16,
    "seed": 0,
}


def bare_train(stack: AirflowStack, config: TrainConfig, workers: int) -> tuple[float, dict]:
    """Run the local backend's torchrun command for ``config``; return (wall seconds, result.json)."""
    uri = paths.train_config_uri(config.output_uri)
    storage.write_bytes(uri, config.to_json().encode())
    # The command depends on the config and the worker count only; this machine is the "placement".
    here = Placement(
        run_id=config.run_id,
        cloud="local",
        region="localhost",
        zone="localhost",
        gpu_type="cpu",
        gpus_per_node=workers,
        num_nodes=1,
        num_gpus=workers,
        market="on_demand",
        instance_type="localhost",
        usd_per_hour=0.0,
    )
    cmd = LocalBackend(stack.settings()).command(TrainLaunch(config.run_id, "bare", uri, workers, here))
    env = {**stack.env, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.monotonic() - started, storage.read_json(config.result_uri)


def _ts(value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target-s", type=float, default=120.0, help="training seconds to aim for")
    parser.add_argument("--steps", type=int, help="fixed total_steps (skips the calibration)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the services on SIGTERM too

    root = Path(tempfile.mkdtemp(prefix="sailor-bench-", dir="/tmp"))
    stack = AirflowStack(root, ROOT)
    try:
        stack.start()
        settings = stack.settings()
        source = storage.resolve(DEMO_DATASET, settings)
        write_demo_dataset(source)
        client = stack.client()
        client.unpause("sailor_train")
        workers, batch = PARAMS["num_workers"], PARAMS["batch_size"]

        steps = args.steps
        if steps is None:  # calibrate on the same machine, model and batch: steps/s from a short run
            probe = TrainConfig(
                run_id="calibrate",
                model=PARAMS["model"],
                data_uri=source,
                output_uri=f"file://{root}/calibrate",
                total_steps=60,
                checkpoint_every_steps=60,
                batch_size=batch,
            )
            _, result = bare_train(stack, probe, workers)
            steps_per_s = result["samples_per_s"] / (batch * workers)
            steps = max(50, int(round(args.target_s * steps_per_s / 10.0)) * 10)
        params = {**PARAMS, "total_steps": steps, "checkpoint_every_steps": max(10, steps // 5)}

        run = client.trigger("sailor_train", params)
        run_id = run["dag_run_id"]
        # Poll slowly: the wall time comes from the run's own timestamps (queued → end), and every
        # poll is work for the API server, which shares the 2 cores with training here.
        state = client.wait("sailor_train", run_id, timeout_s=3600, poll_s=10.0)
        if state != "success":
            raise RuntimeError(f"sailor_train {run_id} ended {state}\n{stack.dump_logs()}")
        info = client.dag_run("sailor_train", run_id)
        dag_wall = (_ts(info["end_date"]) - _ts(info["queued_at"])).total_seconds()

        ledger = Ledger(settings.ledger_url)
        record = ledger.get_run(run_id)
        run_uri = paths.run_uri(record["region"], run_id, settings)
        config = TrainConfig.from_json(storage.read_bytes(paths.train_config_uri(run_uri)).decode())
        bare_config = dataclasses.replace(config, output_uri=f"file://{root}/bare")
        bare_wall, bare_result = bare_train(stack, bare_config, workers)
        dag_result = storage.read_json(config.result_uri)
        stages = {t["stage"]: round(t["seconds"], 2) for t in ledger.stage_timings(run_id) if t["ok"]}
        ledger.dispose()
    finally:
        stack.stop()
        shutil.rmtree(root, ignore_errors=True)

    print(
        json.dumps(
            {
                "orchestration_s": round(dag_wall - bare_wall, 2),
                "train_dag_wall_s": round(dag_wall, 2),
                "bare_training_wall_s": round(bare_wall, 2),
                "overhead_ratio": round(dag_wall / bare_wall, 3),
                "total_steps": steps,
                "num_workers": workers,
                "train_task_wall_s": stages.get("train"),
                "outside_train_task_s": round(dag_wall - (stages.get("train") or 0.0), 2),
                "train_task_over_bare_s": None
                if stages.get("train") is None
                else round(stages["train"] - bare_wall, 2),
                "stage_s": stages,
                # Training speed inside each: a gap here is CPU contention on the machine, not Airflow.
                "samples_per_s_dag": round(dag_result["samples_per_s"], 1),
                "samples_per_s_bare": round(bare_result["samples_per_s"], 1),
                "final_loss_dag": record["final_loss"],
                "final_loss_bare": bare_result["final_loss"],
                # the same work on both sides: the same seed and data give the same final loss
                "same_final_loss": record["final_loss"] == bare_result["final_loss"],
                "placed_in": f"{record['region']}/{record['gpu_type']}",
                "cpu_count": os.cpu_count(),
            }
        )
    )


if __name__ == "__main__":
    main()
