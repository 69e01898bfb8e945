"""``sailor simulate``: a job trace under a scheduling policy in Gavel-style rounds (spot market: spot.py)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from sailor_tasks.catalog.throughput import GAVEL_GPUS
from sailor_tasks.cli.output import print_table


def add_parser(sub: Any) -> None:
    p = sub.add_parser("simulate", help="simulate a job trace under a scheduling policy (Gavel-style rounds)")
    add_arguments(p)
    p.set_defaults(func=cmd_simulate)


def cmd_simulate(args: argparse.Namespace) -> int:
    try:
        result = run_simulation(args)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result))
    else:
        print_table([result], list(result))
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``sailor simulate``.

    Workload sources are a mutually exclusive group (``--trace`` or ``--jobs``), and the cluster,
    policy and hooks are separate groups, so later modes (availability traces, recovery strategies,
    deadlines) add arguments without changing the existing ones.
    """
    from sailor_tasks.policies import policy_names

    work = p.add_argument_group("workload").add_mutually_exclusive_group(required=True)
    work.add_argument("--trace", help="Gavel trace file (10 tab-separated fields per line)")
    work.add_argument("--jobs", type=int, help="generate N jobs (Poisson arrivals, Philly-like sizes)")
    p.add_argument("--jobs-per-hour", type=float, default=10.0, help="arrival rate with --jobs (default 10)")
    p.add_argument(
        "--throughputs",
        help="Gavel simulation_throughputs.json (with space-sharing pairs); default: the packaged table",
    )
    p.add_argument(
        "--cluster",
        default="v100=8,p100=16,k80=24",
        help="GPUs per type, e.g. v100=8,p100=16,k80=24 (Gavel's lowercase or catalog names)",
    )
    p.add_argument("--regions", type=int, default=1, help="identical regions, each with --cluster GPUs")
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="processes simulating the regions in parallel (default 1; same results for any value)",
    )
    p.add_argument("--policy", default="las", help=f"one of: {', '.join(policy_names())}")
    p.add_argument("--round-s", type=float, default=360.0, help="round length in seconds (default 360)")
    p.add_argument("--seed", type=int, default=0, help="seed of the workload and the simulation (default 0)")
    p.add_argument("--space-sharing", action="store_true", help="let two jobs share a GPU (las, makespan)")
    p.add_argument(
        "--market",
        choices=("spot", "on_demand"),
        default="on_demand",
        help="catalog prices used for cost (and min_cost)",
    )
    from sailor_tasks.simulator.rounds.config import DEFAULT_RECOVERY
    from sailor_tasks.simulator.rounds.replan import recovery_names
    from sailor_tasks.simulator.rounds.routing import ROUTERS

    hooks = p.add_argument_group("routing and recovery (the placement engine and strategies registry)")
    hooks.add_argument(
        "--router",
        default="placement",
        help=f"how arriving jobs pick a region: {' or '.join(ROUTERS)} (baseline); default placement",
    )
    hooks.add_argument(
        "--recovery",
        default=DEFAULT_RECOVERY,
        help=f"where a preempted job continues: one of {', '.join(recovery_names())}; "
        f"default {DEFAULT_RECOVERY}",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    from sailor_tasks.cli.spot import add_spot_arguments

    add_spot_arguments(p.add_argument_group("spot economics (with --strategy; see simulator/spot.py)"))


def parse_cluster(text: str, known: tuple[str, ...]) -> dict[str, int]:
    """``"v100=8,p100=16"`` → ``{"V100": 8, "P100": 16}``.

    Raises:
        ValueError: a malformed item, a negative count, or a GPU type not in ``known``.
    """
    out: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, count = item.partition("=")
        gpu = GAVEL_GPUS.get(name.strip().lower(), name.strip().upper())
        if not sep or not count.strip().isdigit():
            raise ValueError(f"--cluster item {item!r}: expected TYPE=COUNT, e.g. v100=8")
        if gpu not in known:
            raise ValueError(
                f"--cluster GPU type {name!r} is not in the throughput table; valid: {', '.join(known)}"
            )
        out[gpu] = out.get(gpu, 0) + int(count)
    if not out or sum(out.values()) == 0:
        raise ValueError(f"--cluster {text!r}: no GPUs")
    return out


def check_hooks(router: str, recovery: str) -> None:
    """Reject an unknown ``--router`` or ``--recovery`` before any work, listing the valid names.

    Raises:
        ValueError: the message names the bad value and the valid choices.
    """
    from sailor_tasks.simulator.rounds.replan import recovery_names
    from sailor_tasks.simulator.rounds.routing import ROUTERS

    if router not in ROUTERS:
        raise ValueError(f"--router {router!r} is not a router; valid: {', '.join(ROUTERS)}")
    if recovery not in recovery_names():
        raise ValueError(
            f"--recovery {recovery!r} is not a recovery strategy; valid: {', '.join(recovery_names())}"
        )


def catalog_prices(gpu_types, market: str) -> dict[str, float]:
    """Cheapest USD per GPU-hour of each type in the catalog (types it does not sell are left out)."""
    from sailor_tasks.catalog import load_catalog

    prices: dict[str, float] = {}
    for offer in load_catalog().offers:
        if offer.gpu_type in gpu_types:
            p = offer.usd_per_gpu_hour(market)
            prices[offer.gpu_type] = min(p, prices.get(offer.gpu_type, p))
    return prices


def run_simulation(args: argparse.Namespace) -> dict[str, Any]:
    from sailor_tasks.catalog.throughput import load_gavel, load_packaged
    from sailor_tasks.policies import get_policy
    from sailor_tasks.simulator import Region, SimConfig, generate_jobs, read_gavel_trace, simulate
    from sailor_tasks.simulator.rounds.replan import make_recovery
    from sailor_tasks.simulator.rounds.routing import PlacementRouter, SimPlacement, make_router

    if getattr(args, "strategy", None):
        from sailor_tasks.cli.spot import run_spot_simulation

        return run_spot_simulation(args)
    started = time.perf_counter()
    get_policy(args.policy)  # unknown names fail here, listing the valid ones
    check_hooks(args.router, args.recovery)
    table = load_gavel(args.throughputs) if args.throughputs else load_packaged()
    if args.space_sharing and not table.pairs:
        raise ValueError(
            "--space-sharing needs pair throughputs: pass --throughputs simulation_throughputs.json"
        )
    gpus = parse_cluster(args.cluster, table.gpu_types)
    if args.regions < 1:
        raise ValueError(f"--regions {args.regions}: need ≥ 1")
    if args.workers < 1:
        raise ValueError(f"--workers {args.workers}: need ≥ 1 (1 runs every region in this process)")
    if args.trace:
        jobs = read_gavel_trace(args.trace, table)
    else:
        jobs = generate_jobs(args.jobs, args.jobs_per_hour, table, seed=args.seed)
    prices = catalog_prices(set(gpus), args.market)
    regions = [Region(f"region-{r}", gpus, prices) for r in range(args.regions)]
    config = SimConfig(
        policy=args.policy,
        round_s=args.round_s,
        seed=args.seed,
        space_sharing=args.space_sharing,
        router=args.router,
        recovery=args.recovery,
        workers=args.workers,
    )
    placement = SimPlacement(regions, table, config.gpus_per_server)
    router = make_router(config.router, placement)
    strategy = make_recovery(config.recovery, placement)
    sim = simulate(jobs, regions, table, config, router=router, strategy=strategy)
    result = sim.to_json()
    result["cluster"] = gpus
    if isinstance(router, PlacementRouter):
        result["routed_gpu_types"] = router.summary()
    result["wall_s"] = round(time.perf_counter() - started, 3)
    if getattr(args, "json", False):
        # Every completed job's JCT (trace jobs are job000000, job000001, … in line order).
        result["jct_s"] = {k: round(v, 3) for k, v in sim.jct_by_job().items()}
    return result
