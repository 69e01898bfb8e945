"""Preemption resilience on the local backend: the same small training run (a) uninterrupted,
(b) with 5 noticed preemptions at random steps, (c) with 5 kills without notice. Every run goes
through the real stages (plan, place_data, provision, train with recovery) and torchrun workers
that are really signalled (SIGTERM then SIGKILL, or SIGKILL). Prints one JSON object last.

- identical_final_params: (b) and (c) end with the uninterrupted run's checkpoint, bit for bit
  (model, optimizer, LR schedule, RNG states, step).
- lost_steps_*: steps between the step reached and the checkpoint resumed from, per preemption.
- recovery_s_p50: median seconds from losing the capacity to the first training step after it
  (re-plan, data/checkpoint copy when the region changes, provision, torchrun start, restore).
- overhead_vs_uninterrupted: extra wall time of (b) over (a), as a fraction of (a).

Run: .venv/bin/python bench/preemption.py [--steps 200] [--every 20] [--seed 0]
"""

from __future__ import annotations

import argparse
import atexit
import json
import logging
import os
import random
import shutil
import statistics
import tempfile
import time


def spread_steps(rng: random.Random, total: int, n: int) -> list[int]:
    """One random step in each of n equal slices of (5, total - 5): preemptions spread over the run."""
    width = (total - 10) // n
    return [5 + i * width + rng.randrange(1, width) for i in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=20, help="checkpoint_every_steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--strategy", default="eager_next_region")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    state = tempfile.mkdtemp(prefix="sailor-bench-preemption-")
    atexit.register(shutil.rmtree, state, ignore_errors=True)
    os.environ["SAILOR_STATE_DIR"] = state
    os.environ.pop("SAILOR_LEDGER_URL", None)
    os.environ.pop("SAILOR_BUCKET_TEMPLATE", None)

    from sailor_tasks import storage
    from sailor_tasks.data.demo import DEMO_DATASET, write_demo_dataset
    from sailor_tasks.settings import Settings
    from sailor_tasks.stages import StageContext
    from sailor_tasks.testing.run_inline import run_inline
    from sailor_tasks.train.checkpoint.dcp import CheckpointManager, diff_states

    settings = Settings.from_env()
    write_demo_dataset(storage.resolve(DEMO_DATASET, settings))
    ctx = StageContext(settings)
    rng = random.Random(args.seed)
    noticed_steps = spread_steps(rng, args.steps, 5)
    kill_steps = spread_steps(rng, args.steps, 5)
    base = {
        "job_name": "bench-preemption",
        "team": "bench",
        "model": "tiny_gpt",
        "num_workers": args.workers,
        "total_steps": args.steps,
        "checkpoint_every_steps": args.every,
        "seed": args.seed,
        "dataset_uri": DEMO_DATASET,
        "recovery_strategy": args.strategy,
        "max_usd_per_hour": 50.0,
    }

    def run(run_id: str, **extra) -> tuple[dict, float]:
        t = time.perf_counter()
        summary = run_inline({**base, **extra}, run_id, ctx, max_tries=12)
        return summary, time.perf_counter() - t

    def final(summary: dict) -> dict:
        root, step = summary["checkpoint_uri"].rsplit("/step-", 1)
        return CheckpointManager(root).load_all(int(step))

    ref, wall_a = run("uninterrupted")
    noticed, wall_b = run("noticed", inject_preemptions=noticed_steps)
    unnoticed, wall_c = run("unnoticed", inject_kills=kill_steps)
    reference = final(ref)
    diffs = diff_states(reference, final(noticed)) + diff_states(reference, final(unnoticed))

    pre_b = ctx.ledger.preemptions("noticed")
    pre_c = ctx.ledger.preemptions("unnoticed")
    recovery = [p["recovery_s"] for p in pre_b + pre_c if p["recovery_s"] is not None]
    result = {
        "noticed": sum(p["noticed"] for p in pre_b),
        "unnoticed": sum(not p["noticed"] for p in pre_c),
        # every injected preemption happened (else the runs below were in effect uninterrupted)
        "all_injected": len(pre_b) == len(noticed_steps)
        and all(p["noticed"] for p in pre_b)
        and len(pre_c) == len(kill_steps)
        and not any(p["noticed"] for p in pre_c),
        "identical_final_params": not diffs,
        "lost_steps_noticed": max((p["steps_lost"] for p in pre_b), default=0),
        "lost_steps_unnoticed_max": max((p["steps_lost"] for p in pre_c), default=0),
        "checkpoint_every_steps": args.every,
        "recovery_s_p50": round(statistics.median(recovery), 2) if recovery else None,
        "recovery_s_max": round(max(recovery), 2) if recovery else None,
        "overhead_vs_uninterrupted": round((wall_b - wall_a) / wall_a, 3),
        "overhead_unnoticed_vs_uninterrupted": round((wall_c - wall_a) / wall_a, 3),
        "wall_s": {
            "uninterrupted": round(wall_a, 1),
            "noticed": round(wall_b, 1),
            "unnoticed": round(wall_c, 1),
        },
        "notice_steps": noticed_steps,
        "kill_steps": kill_steps,
        "strategy": args.strategy,
        "total_steps": args.steps,
        "workers": args.workers,
    }
    if diffs:
        result["differing_keys"] = diffs[:10]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
