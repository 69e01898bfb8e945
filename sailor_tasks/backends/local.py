"""The local backend: a "cluster" is a record file plus a torchrun process group on this machine.

Region buckets are folders under the state folder (see ``Settings.bucket_template``); everything
a cloud run does happens here for real: data copies, training, checkpoints, restarts.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from typing import Any

from sailor_tasks.backends.base import TrainLaunch
from sailor_tasks.model import Placement, to_dict
from sailor_tasks.settings import Settings

logger = logging.getLogger(__name__)


class LocalBackend:
    name = "local"

    def __init__(self, settings: Settings):
        self.settings = settings

    def _record_path(self, run_key: str) -> str:
        return os.path.join(self.settings.clusters_dir, f"{run_key}.json")

    def provision(self, run_key: str, placement: Placement) -> dict[str, Any]:
        path = self._record_path(run_key)
        if os.path.exists(path):
            with open(path) as f:
                record = json.load(f)
            if record.get("placement", {}).get("zone") == placement.zone:
                logger.info("local cluster %s already provisioned in %s; reusing it", run_key, placement.zone)
                return record
        record = {
            "run_key": run_key,
            "backend": self.name,
            "status": "ready",
            "workers": placement.num_gpus,
            "placement": to_dict(placement),
            "created_at": time.time(),
        }
        os.makedirs(self.settings.clusters_dir, exist_ok=True)
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            json.dump(record, f, indent=2)
        os.replace(tmp, path)
        logger.info(
            "provisioned local cluster %s: %d workers standing in for %dx %s %s in %s",
            run_key,
            placement.num_gpus,
            placement.num_gpus,
            placement.gpu_type,
            placement.market,
            placement.zone,
        )
        return record

    def command(self, launch: TrainLaunch) -> list[str]:
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={launch.num_workers}",
            "-m",
            "sailor_tasks.train",
            "--config",
            launch.config_uri,
        ]

    def train(self, launch: TrainLaunch) -> int:
        cmd = self.command(launch)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        logger.info("launching: %s", " ".join(cmd))
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        for line in proc.stdout or ():  # stream worker output into the task log as it happens
            logger.info("%s", line.rstrip())
        return proc.wait()

    def teardown(self, run_key: str) -> bool:
        path = self._record_path(run_key)
        if not os.path.exists(path):
            return False
        os.remove(path)
        logger.info("tore down local cluster %s", run_key)
        return True
