"""The ``train`` stage on the gke backend, with each rendered pod's command run as a process here.

No Kubernetes cluster can run on this machine, so the pod runner (the hook the Airflow glue fills
with GKEStartPodOperator) starts every pod's container command as a local process with the pod's
env. The only change is the rendezvous address: the headless service's DNS name becomes
127.0.0.1. Everything else is what the pods would do: torchrun across the run's nodes, the config
read from gs://, data read from the placed replica, checkpoints and result written to gs:// (a
real GCS API server), and the stage reading the result back.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sailor_tasks import stages, storage
from sailor_tasks.backends import gke
from sailor_tasks.testing.gcs_emulator import free_port
from sailor_tasks.train.checkpoint.dcp import CheckpointManager

pytestmark = [pytest.mark.gke, pytest.mark.gcs, pytest.mark.slow]

REGION = "us-central1"


def run_pods_as_local_processes(config, launch, pods, service):
    port = str(free_port())
    procs = []
    for pod in pods:
        (container,) = pod.spec.containers
        cmd = [sys.executable if c == "python" else c for c in container.command]
        if service is not None:
            host = f"{service.metadata.name}.{config.namespace}.svc.cluster.local"
            cmd = [
                {
                    f"--master-addr={host}": "--master-addr=127.0.0.1",
                    f"--master-port={gke.RENDEZVOUS_PORT}": f"--master-port={port}",
                }.get(c, c)
                for c in cmd
            ]
        env = {**os.environ, **{e.name: e.value for e in container.env}, "OMP_NUM_THREADS": "1"}
        env.pop("MASTER_ADDR", None)
        env.pop("MASTER_PORT", None)
        procs.append(
            subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        )
    codes = []
    for proc in procs:
        out, _ = proc.communicate(timeout=300)
        codes.append(proc.returncode)
        if proc.returncode:
            print(out[-3000:])
    return max(codes)


def test_gke_train_stage_runs_the_rendered_pods_to_a_checkpointed_result(
    gcs, settings, one_gpu_vms, monkeypatch
):
    import uuid

    prefix = f"t-{uuid.uuid4().hex[:10]}"
    for bucket in ("source", REGION):
        gcs(f"{prefix}-{bucket}")
    monkeypatch.setenv("SAILOR_BUCKET_TEMPLATE", f"gs://{prefix}-{{bucket}}")
    monkeypatch.setenv("SAILOR_GCP_PROJECT", "acme-ml")  # a gke run needs a project
    monkeypatch.setattr(gke, "_pod_runner", run_pods_as_local_processes)
    from sailor_tasks.data.demo import DEMO_DATASET, write_demo_dataset
    from sailor_tasks.settings import Settings

    ctx = stages.StageContext(Settings.from_env())
    write_demo_dataset(storage.resolve(DEMO_DATASET, ctx.settings), num_shards=1, shard_bytes=40_000)
    params = {
        "job_name": "gke-pods",
        "team": "qa",
        "model": "tiny_gpt",
        "backend": "gke",
        "num_workers": 2,
        "regions": [REGION],
        "market": "spot",
        "total_steps": 12,
        "checkpoint_every_steps": 6,
        "batch_size": 4,
        "dataset_uri": DEMO_DATASET,
    }
    run_id = "manual__gke-pods"
    request = stages.validate(params, run_id, ctx)
    placement = stages.plan(request, run_id, ctx)
    assert placement["num_nodes"] == 2  # two 1-GPU VMs: torchrun rendezvous across "nodes"
    data = stages.place_data(request, placement, run_id, ctx)
    result = stages.train(request, placement, data, run_id, ctx)

    assert result["step"] == 12 and result["final_loss"] < result["initial_loss"]
    assert result["checkpoint_uri"].startswith(f"gs://{prefix}-{REGION}/runs/")
    assert CheckpointManager(result["checkpoint_uri"].rsplit("/", 1)[0]).latest_valid_step() == 12
    (run,) = ctx.ledger.list_runs()
    assert run["backend"] == "gke" and run["steps"] == 12
