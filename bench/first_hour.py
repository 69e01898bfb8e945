"""A new user's first hour, on the real local stack: submit to a paused DAG, show a run, read its
logs, cancel a run and count the processes it left, and count the command's options without help.

Starts the real services (PostgreSQL, api-server, scheduler, dag-processor, triggerer; see
``sailor_tasks.testing.airflow_stack``) and drives them only through the ``sailor`` command
(``sailor_tasks.testing.first_hour``): ``submit`` to the paused ``sailor_train`` (refused, saying how
to unpause) then ``--unpause`` (a 40-step run followed to success); ``show`` (placement and its
explanation, attempts with market and cost, data, checkpoints, summary); ``logs --task train`` from
the log folder and through the REST API (step/loss lines); a long run cancelled with ``sailor
cancel`` once its workers are up, while ``sailor logs --follow`` follows it, then every process
whose environment names the run is counted (psutil); ``sailor check --backend local`` in the
stack's environment, and ``sailor check --backend gke`` with no GCP setup (no connection, project,
bucket template or gcloud login), counting the prerequisites it reports failing with a fix.

Prints one JSON object as its last line: ``{"show_ok", "logs_ok", "cancel_leftover_processes",
"check_local_ok", "check_gke_reports", "submit_paused_dag_ok", "flags_without_help", ...}``.
``--checks-only`` runs only the two checks and ``flags_without_help``, without the stack (a fresh
state folder, this project's DAGs folder).

Run: .venv/bin/python bench/first_hour.py [--checks-only]
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from sailor_tasks import storage
from sailor_tasks.cli.main import options_without_help
from sailor_tasks.data.demo import DEMO_DATASET, write_demo_dataset
from sailor_tasks.testing.airflow_stack import AirflowStack
from sailor_tasks.testing.first_hour import check_gke, check_local, first_hour

ROOT = Path(__file__).resolve().parents[1]


def checks_only() -> dict:
    """The two checks without the stack: a fresh state folder, this project's DAGs and plugins."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sailor-bench-check-", dir="/tmp") as root:
        env = {
            **os.environ,
            "SAILOR_STATE_DIR": str(Path(root) / "state"),
            "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        }
        env.pop("SAILOR_LEDGER_URL", None)
        local, gke = check_local(env), check_gke(env)
    return {
        "check_local_ok": local["ok"],
        "check_gke_reports": gke["reports"],
        "flags_without_help": len(options_without_help()),
        "wall_s": round(time.monotonic() - started, 1),
        "details": {"check_local": local, "check_gke": gke},
    }


def main() -> None:
    if "--checks-only" in sys.argv[1:]:
        print(json.dumps(checks_only(), default=str))
        return
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the services on SIGTERM too
    root = Path(tempfile.mkdtemp(prefix="sailor-bench-", dir="/tmp"))
    stack = AirflowStack(root, ROOT)
    started = time.monotonic()
    try:
        stack.start()
        write_demo_dataset(storage.resolve(DEMO_DATASET, stack.settings()), num_shards=2, shard_bytes=64_000)
        result = first_hour(stack)
    except BaseException:
        print(stack.dump_logs(), file=sys.stderr)
        raise
    finally:
        stack.stop()
        shutil.rmtree(root, ignore_errors=True)
    result["flags_without_help"] = len(options_without_help())
    result["wall_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(result, default=str))


if __name__ == "__main__":
    main()
