"""Scheduling quality against Gavel's own simulator, side by side on the same traces.

Traces are generated the way Gavel's drivers generate jobs (``rounds/workload.generate_jobs``:
Philly-derived durations 10^U(1.5, 3) minutes with probability 0.8, else 10^U(3, 4); scale factors
1/2/4/8 with probabilities 0.7/0.1/0.15/0.05; steps = duration × the job type's V100 throughput in
Gavel's ``simulation_throughputs.json``): continuous Poisson arrivals at each ``--rates`` (jobs/h)
and a static trace (every job at t = 0), for every ``--seeds``. Each trace runs under each policy
pair, SAILOR's simulator (in this process) against Gavel's (``../shared/tools/gavel/simulate``, its
own code), both with 360 s rounds and seed 0, on the same cluster (``--cluster`` V100:P100:K80,
4-GPU servers on both sides). The space-sharing pairs run on traces of 1-GPU jobs (Gavel's
generator without multi-GPU jobs, as in its space-sharing experiments: its packed LPs fail when
jobs of different scale factors have different numbers of partners), the others on traces with
multi-GPU jobs.

Like for like: Gavel's simulator runs every job at its consolidated throughput wherever its
workers land, so SAILOR runs here with the same table without the unconsolidated entries (its own
simulator slows a job spread over servers; Gavel's does not). Routing is ``least_loaded`` (one
region: nothing to route).

The ratio of a case is SAILOR / Gavel on the pair's metric: average JCT, or makespan for the
makespan policies (< 1: SAILOR is better). Gavel's results are cached by trace hash, policy,
cluster, round length, seed, throughput table and Gavel's code under ``--cache`` (default ``~/.cache/sailor/gavel_parity``), so a
rerun only re-simulates SAILOR. Job counts are small (``--jobs``, default 24) because Gavel's
cvxpy solver, re-run at every arrival and completion, takes minutes per trace beyond that
(its space-sharing LP has a variable per job pair). Prints one JSON object (last line);
``target_met``: at least 24 cases, median ratio <= 1.00, max <= 1.03.

    .venv/bin/python bench/gavel_parity.py [--jobs 24] [--rates 0.3,0.6,1.2] [--seeds 0,1]
        [--pairs las,las_agnostic,ftf,makespan,las_packed,makespan_packed] [--parallel 2]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from sailor_tasks.catalog.throughput import load_gavel
from sailor_tasks.simulator import Region, SimConfig, SimJob, generate_jobs, simulate

ROOT = Path(__file__).resolve().parents[1]
SHARED = (
    Path(os.environ["SAILOR_SHARED_DATA"]).parent
    if os.environ.get("SAILOR_SHARED_DATA")
    else ROOT.parent / "shared"
)

PAIRS = {
    # name: (SAILOR policy, space sharing, Gavel policy, metric)
    "las": ("las", False, "max_min_fairness_perf", "avg_jct_s"),
    "las_agnostic": ("las_agnostic", False, "max_min_fairness", "avg_jct_s"),
    "ftf": ("ftf", False, "finish_time_fairness_perf", "avg_jct_s"),
    "makespan": ("makespan", False, "min_total_duration_perf", "makespan_s"),
    "las_packed": ("las", True, "max_min_fairness_packed", "avg_jct_s"),
    "makespan_packed": ("makespan", True, "min_total_duration_packed", "makespan_s"),
}
GPU_ORDER = ("V100", "P100", "K80")
"""Gavel's cluster spec order (V100:P100:K80)."""
ROUND_S = 360.0
SEED = 0
GPUS_PER_SERVER = 4
TARGET_CASES, TARGET_MEDIAN, TARGET_MAX = 24, 1.00, 1.03
"""``target_met``: at least this many trace x pair cases, median and max ratio to Gavel at most these."""


def trace_lines(jobs: list[SimJob]) -> str:
    """Gavel's 10 tab-separated fields per job (the command fields are not used by its simulator)."""
    out = []
    for j in jobs:
        model, scale = j.job_type
        out.append(
            "\t".join(
                [
                    model,
                    "python3 train.py",
                    ".",
                    "--num_steps",
                    "0",
                    str(int(j.total_steps)),
                    str(scale),
                    f"{j.priority_weight:g}",
                    "-1",
                    f"{j.arrival_s:.6f}",
                ]
            )
        )
    return "\n".join(out) + "\n"


def make_traces(
    table, n: int, rates: list[float], seeds: list[int], multi_gpu: bool
) -> list[tuple[str, list[SimJob]]]:
    """Poisson traces at every rate and a static one, per seed. ``multi_gpu`` False: 1-GPU jobs
    (Gavel's space-sharing LP only runs when every job has the same scale factor)."""
    kind = "" if multi_gpu else "1gpu-"
    traces = []
    for seed in seeds:
        for rate in rates:
            jobs = generate_jobs(n, rate, table, seed=seed, multi_gpu=multi_gpu)
            traces.append((f"{kind}poisson{rate:g}/h-s{seed}", jobs))
        jobs = generate_jobs(n, 1.0, table, seed=1000 + seed, multi_gpu=multi_gpu)
        traces.append((f"{kind}static-s{seed}", [replace(j, arrival_s=0.0) for j in jobs]))
    # Gavel needs whole steps: both sides run the same integer step counts.
    return [
        (name, [replace(j, total_steps=float(int(j.total_steps))) for j in jobs]) for name, jobs in traces
    ]


def run_gavel(gavel: Path, cache: Path, text: str, policy: str, cluster: str, table: str = "") -> dict:
    """Gavel's result on the trace ``text``, cached by everything it depends on (``table``: a hash
    of the throughput table Gavel reads)."""
    key = hashlib.sha256(
        json.dumps([text, policy, cluster, ROUND_S, SEED, GPUS_PER_SERVER, table]).encode()
    ).hexdigest()[:24]
    path = cache / f"{key}.json"
    if path.exists():
        out = json.loads(path.read_text())
        out["cached"] = True
        return out
    cache.mkdir(parents=True, exist_ok=True)
    trace = cache / f"{key}.trace"
    trace.write_text(text)
    per_server = ":".join([str(GPUS_PER_SERVER)] * 3)
    proc = subprocess.run(
        [
            str(gavel),
            str(trace),
            policy,
            cluster,
            "--seed",
            str(SEED),
            "--round-s",
            f"{ROUND_S:g}",
            "--gpus-per-server",
            per_server,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0 or not proc.stdout.strip():
        raise RuntimeError(f"Gavel failed on {trace} with {policy}: {proc.stderr[-2000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    path.write_text(json.dumps(out))
    out["cached"] = False
    return out


def run_sailor(jobs: list[SimJob], table, gpus: dict[str, int], policy: str, space_sharing: bool) -> dict:
    result = simulate(
        jobs,
        [Region("gavel", gpus)],
        table,
        SimConfig(
            policy=policy,
            round_s=ROUND_S,
            seed=SEED,
            space_sharing=space_sharing,
            gpus_per_server=GPUS_PER_SERVER,
            router="least_loaded",
        ),
    )
    if result.completed != len(jobs):
        raise RuntimeError(f"SAILOR completed {result.completed} of {len(jobs)} jobs with {policy}")
    return {
        "avg_jct_s": result.avg_jct_s,
        # Gavel's "Total duration" is the last finish counted from t = 0, the trace's origin, not
        # from the first arrival as SAILOR's makespan_s is: the same origin on both sides.
        "makespan_s": result.makespan_s + min(j.arrival_s for j in jobs),
        "jct": result.jct_by_job(),
        "wall_s": result.wall_s,
    }


def by_scale(jobs: list[SimJob], sailor_jct: dict, gavel_jct: dict) -> dict[str, float]:
    """SAILOR / Gavel total JCT of the jobs of each scale factor (where SAILOR gains or loses)."""
    out = {}
    for s in sorted({j.scale_factor for j in jobs}):
        idx = [i for i, j in enumerate(jobs) if j.scale_factor == s]
        a = sum(sailor_jct[jobs[i].job_id] for i in idx)
        b = sum(gavel_jct[str(i)] for i in idx)
        out[str(s)] = round(a / b, 3) if b > 0 else None
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=24, help="jobs per trace (default 24)")
    p.add_argument(
        "--rates", default="0.3,0.6,1.2", help="Poisson arrival rates, jobs/h (default 0.3,0.6,1.2)"
    )
    p.add_argument("--seeds", default="0,1", help="trace seeds (default 0,1)")
    p.add_argument("--cluster", default="8:8:8", help="V100:P100:K80 GPUs (default 8:8:8)")
    p.add_argument("--pairs", default=",".join(PAIRS), help=f"policy pairs (default all: {', '.join(PAIRS)})")
    p.add_argument("--gavel", default=str(SHARED / "tools" / "gavel" / "simulate"), help="Gavel's simulate")
    p.add_argument(
        "--throughputs",
        default=str(SHARED / "data" / "gavel" / "simulation_throughputs.json"),
        help="Gavel's simulation_throughputs.json: the copy of the table Gavel's simulator reads (refused otherwise)",
    )
    p.add_argument("--cache", default=str(Path.home() / ".cache" / "sailor" / "gavel_parity"))
    p.add_argument("--parallel", type=int, default=2, help="Gavel runs at once (default 2)")
    p.add_argument("--verbose", action="store_true", help="one line per case on stderr")
    args = p.parse_args()

    pairs = [x for x in args.pairs.split(",") if x]
    bad = [x for x in pairs if x not in PAIRS]
    if bad:
        sys.exit(f"--pairs {','.join(bad)}: unknown; valid: {', '.join(PAIRS)}")
    counts = args.cluster.split(":")
    if len(counts) != 3 or not all(c.isdigit() for c in counts):
        sys.exit(f"--cluster {args.cluster!r}: expected V100:P100:K80 counts, e.g. 8:8:8")
    gpus = {g: int(c) for g, c in zip(GPU_ORDER, counts, strict=True) if int(c) > 0}
    rates = [float(r) for r in args.rates.split(",") if r]
    seeds = [int(s) for s in args.seeds.split(",") if s]
    # Gavel's simulator reads the table in its own source folder (its wrapper takes no other), from
    # the private copy the wrapper runs (under GAVEL_HOME, refreshed when Gavel's scheduler.py is
    # newer): SAILOR must read the same one, or the ratios compare two simulators on two inputs.
    src = Path(args.gavel).resolve().parent / "src"
    home = Path(
        os.environ.get("GAVEL_HOME")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sailor-gavel"
    )
    for read in (src / "simulation_throughputs.json", home / "src" / "simulation_throughputs.json"):
        if read.is_file() and Path(args.throughputs).read_bytes() != read.read_bytes():
            sys.exit(
                f"--throughputs {args.throughputs}: not the table Gavel's simulator reads ({read}); "
                "both sides need the same"
            )
    # Cached results depend on the table and on Gavel's code.
    digest = hashlib.sha256(Path(args.throughputs).read_bytes())
    for path in sorted(src.rglob("*.py")) if src.is_dir() else ():
        digest.update(str(path.relative_to(src)).encode() + path.read_bytes())
    table_hash = digest.hexdigest()[:16]
    started = time.perf_counter()
    full = load_gavel(args.throughputs)
    # Gavel charges no penalty for workers spread over servers: neither does SAILOR here.
    table = replace(full, unconsolidated={})
    traces = []
    cases = []
    for multi_gpu in (True, False):
        mine = [p for p in pairs if PAIRS[p][1] != multi_gpu]
        if mine:
            some = make_traces(full, args.jobs, rates, seeds, multi_gpu)
            traces += some
            cases += [(name, jobs, pair) for name, jobs in some for pair in mine]

    gavel_started = time.perf_counter()

    def gavel_case(case: tuple) -> dict:
        _, jobs, pair = case
        return run_gavel(
            Path(args.gavel), Path(args.cache), trace_lines(jobs), PAIRS[pair][2], args.cluster, table_hash
        )

    # The first case runs alone: Gavel's first use builds its solver venv, and two first uses at
    # once would build it into the same folder.
    gavel_out = [gavel_case(c) for c in cases[:1]]
    with ThreadPoolExecutor(max(1, args.parallel)) as pool:
        gavel_out += list(pool.map(gavel_case, cases[1:]))
    gavel_s = time.perf_counter() - gavel_started

    rows = []
    sailor_s = 0.0
    for (name, jobs, pair), g in zip(cases, gavel_out, strict=True):
        policy, ss, gavel_policy, metric = PAIRS[pair]
        s = run_sailor(jobs, table, gpus, policy, ss)
        sailor_s += s["wall_s"]
        if len(g["jct_s"]) != len(jobs):
            raise RuntimeError(
                f"Gavel completed {len(g['jct_s'])} of {len(jobs)} jobs on {name} with {gavel_policy}"
            )
        ratio = s[metric] / g[metric]
        row = {
            "trace": name,
            "pair": pair,
            "metric": metric,
            "sailor": round(s[metric], 1),
            "gavel": round(g[metric], 1),
            "ratio": round(ratio, 4),
            "by_scale": by_scale(jobs, s["jct"], g["jct_s"]),
        }
        rows.append(row)
        if args.verbose:
            print(json.dumps(row), file=sys.stderr)

    per_pair = {}
    for pair in pairs:
        r = [row["ratio"] for row in rows if row["pair"] == pair]
        per_pair[pair] = {
            "median": round(statistics.median(r), 4),
            "max": round(max(r), 4),
            "min": round(min(r), 4),
        }
    ratios = [row["ratio"] for row in rows]
    print(
        json.dumps(
            {
                "bench": "gavel_parity",
                "cases": len(rows),
                "traces": len(traces),
                "jobs_per_trace": args.jobs,
                "cluster": gpus,
                "rates_per_h": rates,
                "seeds": seeds,
                "median_ratio": round(statistics.median(ratios), 4),
                "max_ratio": round(max(ratios), 4),
                "target_met": len(rows) >= TARGET_CASES
                and statistics.median(ratios) <= TARGET_MEDIAN
                and max(ratios) <= TARGET_MAX,
                "ratio_per_pair": per_pair,
                "worst": sorted(rows, key=lambda row: -row["ratio"])[:3],
                "gavel_cached": sum(bool(g.get("cached")) for g in gavel_out),
                "gavel_s": round(gavel_s, 1),
                "sailor_s": round(sailor_s, 1),
                "wall_s": round(time.perf_counter() - started, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
