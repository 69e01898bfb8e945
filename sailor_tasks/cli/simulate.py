"""``sailor simulate``: a job trace under a scheduling policy in Gavel-style rounds, or admitted
through SAILOR's live queue (``--admission queue``); spot market: spot.py."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from sailor_tasks.catalog.throughput import GAVEL_GPUS
from sailor_tasks.cli.argtypes import positive_float, seed
from sailor_tasks.cli.output import print_json, print_table
from sailor_tasks.errors import SailorError


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "simulate",
        help="simulate a job trace under a scheduling policy (Gavel-style rounds, or the live queue)",
    )
    add_arguments(p)
    p.set_defaults(func=cmd_simulate)


def cmd_simulate(args: argparse.Namespace) -> int:
    try:
        result = run_simulation(args)
    except (ValueError, OSError, SailorError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print_json(result, indent=None)
        return 0
    teams = result.pop("teams", None)
    print_table([result], list(result))
    if teams:
        rows = [{"team": team, **figures} for team, figures in teams.items()]
        print_table(rows, list(rows[0]))
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
    p.add_argument(
        "--jobs-per-hour", type=positive_float, default=10.0, help="arrival rate with --jobs (default 10)"
    )
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
    p.add_argument(
        "--round-s", type=positive_float, default=360.0, help="round length in seconds (default 360)"
    )
    p.add_argument("--seed", type=seed, default=0, help="seed of the workload and the simulation (default 0)")
    p.add_argument("--space-sharing", action="store_true", help="let two jobs share a GPU (las, las_agnostic, makespan)")
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
    add_queue_arguments(p.add_argument_group("admission through SAILOR's queue (--admission queue)"))
    p.add_argument("--json", action="store_true", help="print one JSON object")
    from sailor_tasks.cli.spot import add_spot_arguments

    add_spot_arguments(p.add_argument_group("spot economics (with --strategy; see simulator/spot.py)"))


ADMISSIONS = ("rounds", "queue")
"""How simulated jobs get GPUs: ``rounds`` (Gavel's model: every arrived job time-shares the
cluster) or ``queue`` (SAILOR's live queue: admitted by the queue policy, GPUs held to the end)."""
UNCAPPED = "unlimited"
NO_ON_DEMAND = "none"


def add_queue_arguments(g: Any) -> None:
    """Arguments of the queue simulator (``sailor_tasks.simulator.queue``)."""
    from sailor_tasks.queue import QUEUE_POLICIES

    g.add_argument(
        "--admission",
        choices=ADMISSIONS,
        default="rounds",
        help="rounds: every arrived job time-shares the cluster (Gavel); queue: SAILOR's live admission "
        "(the queue policy admits waiting runs, each holds its GPUs to its end); default rounds",
    )
    g.add_argument(
        "--queue-policy",
        choices=QUEUE_POLICIES,
        help="with --admission queue: the queue policy (default las)",
    )
    g.add_argument(
        "--on-demand",
        help="with --admission queue: on-demand GPUs per type beside the --cluster spot GPUs, e.g. "
        f"v100=2,t4=2; {UNCAPPED} (default: not capped) or {NO_ON_DEMAND}",
    )
    g.add_argument(
        "--team-weights",
        help="with --admission queue: las team weights, e.g. a=2,b=1 (unlisted teams weigh 1)",
    )
    g.add_argument(
        "--arrival-hours",
        type=positive_float,
        help="with --admission queue and --jobs: the second team's runs arrive over this many hours "
        "(default 16; the first team's arrive in a burst)",
    )


def parse_cluster(text: str, known: tuple[str, ...], flag: str = "--cluster") -> dict[str, int]:
    """``"v100=8,p100=16"`` → ``{"V100": 8, "P100": 16}``.

    Raises:
        ValueError: a malformed item, a negative count, or a GPU type not in ``known``.
    """
    out: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, count = item.partition("=")
        gpu = GAVEL_GPUS.get(name.strip().lower(), name.strip().upper())
        if not sep or not count.strip().isdigit():
            raise ValueError(f"{flag} item {item!r}: expected TYPE=COUNT, e.g. v100=8")
        if gpu not in known:
            raise ValueError(
                f"{flag} GPU type {name!r} is not in the throughput table; valid: {', '.join(known)}"
            )
        out[gpu] = out.get(gpu, 0) + int(count)
    if not out or sum(out.values()) == 0:
        raise ValueError(f"{flag} {text!r}: no GPUs")
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

    check_admission(args)
    if getattr(args, "admission", "rounds") == "queue":
        return run_queue_simulation(args)
    if getattr(args, "strategy", None) is not None:
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


QUEUE_ONLY = (
    ("--queue-policy", "queue_policy"),
    ("--on-demand", "on_demand"),
    ("--team-weights", "team_weights"),
    ("--arrival-hours", "arrival_hours"),
)
"""Options of the queue simulator: refused without ``--admission queue``."""


def _round_based() -> tuple[tuple[str, str, Any], ...]:
    from sailor_tasks.simulator.rounds.config import DEFAULT_RECOVERY

    return (
        ("--policy", "policy", "las"),
        ("--round-s", "round_s", 360.0),
        ("--regions", "regions", 1),
        ("--workers", "workers", 1),
        ("--space-sharing", "space_sharing", False),
        ("--market", "market", "on_demand"),
        ("--router", "router", "placement"),
        ("--recovery", "recovery", DEFAULT_RECOVERY),
    )


def spot_only() -> tuple[tuple[str, str, Any], ...]:
    """Options only the spot simulator (``--strategy``) reads, with their defaults."""
    from sailor_tasks.cli.spot import DEFAULT_SLACK

    return (
        ("--availability", "availability", None),
        ("--deadline-slack", "deadline_slack", DEFAULT_SLACK),
        ("--bind", "bind", "pool"),
    )


def rounds_only() -> tuple[tuple[str, str, Any], ...]:
    """Options of the round-based and spot simulators with their defaults: refused with
    ``--admission queue`` unless left at the default."""
    return (
        *_round_based(),
        ("--jobs-per-hour", "jobs_per_hour", 10.0),
        ("--strategy", "strategy", None),
        *spot_only(),
    )


def not_spot() -> tuple[tuple[str, str, Any], ...]:
    """Options the spot simulator does not read (it takes its GPUs and prices from the catalog and
    its availability from ``--availability``), with their defaults."""
    return (
        *_round_based(),
        ("--cluster", "cluster", "v100=8,p100=16,k80=24"),
        ("--throughputs", "throughputs", None),
    )


def check_admission(args: argparse.Namespace) -> None:
    """Refuse options of another simulator, naming them (nothing is simulated).

    Raises:
        ValueError: an option that the chosen simulator (``--admission queue``, ``--strategy`` or
            the round-based one) does not read was given.
    """

    def given(options: tuple[tuple[str, str, Any], ...]) -> list[str]:
        return [flag for flag, dest, default in options if getattr(args, dest, default) != default]

    if getattr(args, "admission", "rounds") == "queue":
        if flags := given(rounds_only()):
            raise ValueError(
                f"{', '.join(flags)}: not read with --admission queue (the round-based or spot "
                "simulator's); the queue simulator reads --jobs or --trace, --cluster (spot GPUs), "
                "--on-demand, --queue-policy, --team-weights, --arrival-hours, --throughputs, --seed"
            )
        return
    flags = [flag for flag, dest in QUEUE_ONLY if getattr(args, dest, None) is not None]
    if flags:
        raise ValueError(f"{', '.join(flags)}: only read with --admission queue")
    if getattr(args, "strategy", None) is not None:
        if flags := given(not_spot()):
            raise ValueError(
                f"{', '.join(flags)}: not read by the spot simulator (--strategy), which reads --jobs, "
                "--jobs-per-hour, --availability, --deadline-slack, --bind, --seed"
            )
    elif flags := given(spot_only()):
        raise ValueError(f"{', '.join(flags)}: only read by the spot simulator (with --strategy)")


def parse_weights(text: str) -> dict[str, float]:
    """``"a=2,b=1"`` → ``{"a": 2.0, "b": 1.0}``.

    Raises:
        ValueError: a malformed item or a weight out of ``settings.TEAM_WEIGHT_RANGE``.
    """
    from sailor_tasks.settings import TEAM_WEIGHT_RANGE, team_weight

    out: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        team, sep, value = item.partition("=")
        weight = team_weight(value)
        if not sep or not team.strip() or weight is None:
            raise ValueError(
                f"--team-weights item {item!r}: expected TEAM=WEIGHT with a weight from "
                f"{TEAM_WEIGHT_RANGE[0]:g} to {TEAM_WEIGHT_RANGE[1]:g}, e.g. a=2"
            )
        out[team.strip()] = weight
    return out


def run_queue_simulation(args: argparse.Namespace) -> dict[str, Any]:
    """``sailor simulate --admission queue``: the workload admitted through SAILOR's live queue
    (``sailor_tasks.simulator.queue``) on --cluster spot GPUs and --on-demand GPUs."""
    from sailor_tasks.catalog.throughput import load_gavel, load_packaged
    from sailor_tasks.simulator.queue import QueueSimConfig, from_trace, mixed_queue, simulate_queue
    from sailor_tasks.simulator.rounds.workload import read_gavel_trace

    started = time.perf_counter()
    table = load_gavel(args.throughputs, include_pairs=False) if args.throughputs else load_packaged()
    spot = parse_cluster(args.cluster, table.gpu_types)
    on_demand_text = (args.on_demand or UNCAPPED).strip().lower()
    on_demand: dict[str, int] | None
    if on_demand_text == UNCAPPED:
        on_demand = None
    elif on_demand_text == NO_ON_DEMAND:
        on_demand = {}
    else:
        on_demand = parse_cluster(args.on_demand, table.gpu_types, "--on-demand")
    hours = 16.0 if args.arrival_hours is None else args.arrival_hours
    if args.trace:
        if args.arrival_hours is not None:
            raise ValueError(
                "--arrival-hours shapes the generated queue (--jobs); a --trace has its own arrivals"
            )
        jobs = from_trace(read_gavel_trace(args.trace, table))
    else:
        jobs = mixed_queue(args.jobs, args.seed, table, tuple(spot), hours=hours)
    config = QueueSimConfig(
        spot_gpus=spot,
        on_demand_gpus=on_demand,
        policy=args.queue_policy or "las",
        team_weights=parse_weights(args.team_weights or ""),
    )
    sim = simulate_queue(jobs, table, config)
    result = sim.to_json()
    result["cluster"] = spot
    result["on_demand"] = UNCAPPED if on_demand is None else on_demand
    result["wall_s"] = round(time.perf_counter() - started, 3)
    if getattr(args, "json", False):
        result["jct_s"] = {r.run_id: round(r.jct_s, 3) for r in sim.runs if r.jct_s is not None}
    return result
