"""Parse time of each DAG file: median of N fresh-interpreter parses (Airflow itself pre-imported,
as in the DAG processor). Prints one JSON object as its last line.

Run: .venv/bin/python bench/dag_parse.py [--repeat 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

DAGS = Path(__file__).resolve().parents[1] / "dags"


def parse_once(path: Path) -> float:
    code = (
        "import time, runpy, airflow.sdk; t = time.perf_counter(); "
        f"runpy.run_path({str(path)!r}); print(time.perf_counter() - t)"
    )
    out = subprocess.check_output([sys.executable, "-c", code], text=True)
    return float(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    result = {}
    for dag_id in ("sailor_train", "sailor_rebalance"):
        samples = [parse_once(DAGS / f"{dag_id}.py") for _ in range(max(5, args.repeat))]
        result[f"{dag_id}_parse_s"] = round(statistics.median(samples), 4)
    result["repeat"] = max(5, args.repeat)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
