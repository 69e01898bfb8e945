"""The ``sailor`` command: inspect runs and the catalog, plan a request, run the demo."""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from sailor_tasks.settings import SOURCE_BUCKET, Settings


def _print_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return "" if v is None else str(v)

    cells = [[fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))


def _json_default(value: Any) -> Any:
    if hasattr(value, "isoformat"):
        return value.isoformat()
    raise TypeError(type(value).__name__)


# --- runs ----------------------------------------------------------------------------------------


def cmd_runs(args: argparse.Namespace) -> int:
    from sailor_tasks.ledger import Ledger
    from sailor_tasks.ledger.store import RUN_LIST_FIELDS

    ledger = Ledger(Settings.from_env().ledger_url)
    runs = ledger.list_runs(limit=args.limit)
    rows = [{k: r[k] for k in RUN_LIST_FIELDS} for r in runs]
    if args.json:
        print(json.dumps(rows, indent=2, default=_json_default))
    else:
        _print_table(rows, RUN_LIST_FIELDS)
    return 0


# --- catalog -------------------------------------------------------------------------------------


def cmd_catalog(args: argparse.Namespace) -> int:
    from sailor_tasks.catalog import load_catalog
    from sailor_tasks.model import to_dict

    catalog = load_catalog()
    offers = catalog.select(gpu_types=[args.gpu] if args.gpu else None, regions=args.region or None)
    if args.gpu and args.gpu not in catalog.gpu_types:
        print(
            f"error: --gpu {args.gpu!r} is not in the catalog; valid: {', '.join(catalog.gpu_types)}",
            file=sys.stderr,
        )
        return 2
    bad = [r for r in args.region or () if r not in catalog.regions]
    if bad:
        print(
            f"error: --region {', '.join(bad)} not in the catalog; valid: {', '.join(catalog.regions)}",
            file=sys.stderr,
        )
        return 2
    rows = [to_dict(o) for o in sorted(offers, key=lambda o: (o.gpu_type, o.spot_usd_per_hour))]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        _print_table(
            rows,
            (
                "region",
                "zone",
                "gpu_type",
                "gpus_per_node",
                "instance_type",
                "ondemand_usd_per_hour",
                "spot_usd_per_hour",
                "capacity_gpus",
                "preemption_rate_per_hour",
            ),
        )
    return 0


def cmd_catalog_transfer(args: argparse.Namespace) -> int:
    from sailor_tasks.catalog import load_catalog

    catalog = load_catalog()
    regions = args.region or list(catalog.regions)
    bad = [r for r in regions if r not in catalog.regions]
    if bad:
        print(
            f"error: --region {', '.join(bad)} not in the catalog; valid: {', '.join(catalog.regions)}",
            file=sys.stderr,
        )
        return 2
    table = catalog.transfer
    rows = [
        {
            "src_region": a,
            "dst_region": b,
            "usd_per_gb": table.bucket_usd_per_gb(a, b),
            "gbps": table.bucket_gbps(a, b),
            "src_continent": table.continent(a),
            "dst_continent": table.continent(b),
        }
        for a in regions
        for b in regions
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        _print_table(
            rows, ("src_region", "dst_region", "usd_per_gb", "gbps", "src_continent", "dst_continent")
        )
    return 0


def cmd_catalog_derive(args: argparse.Namespace) -> int:
    from importlib import resources

    from sailor_tasks.catalog.derive import derive_file
    from sailor_tasks.catalog.offers import DEFAULT_OFFERS_FILE

    dest = args.dest or str(resources.files("sailor_tasks.catalog").joinpath("data", DEFAULT_OFFERS_FILE))
    n = derive_file(args.source, dest)
    print(f"wrote {n} offers to {dest}")
    return 0


# --- plan ----------------------------------------------------------------------------------------


def _load_params(path: str | None, overrides: Sequence[str] | None) -> dict[str, Any]:
    """sailor_train params from a JSON file (optional), then ``KEY=VALUE`` overrides (JSON values,
    else plain strings)."""
    params: dict[str, Any] = {}
    if path:
        with open(path) as f:
            params = json.load(f)
    for item in overrides or ():
        key, _, value = item.partition("=")
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            params[key] = value
    return params


def cmd_plan(args: argparse.Namespace) -> int:
    from sailor_tasks.catalog import load_catalog
    from sailor_tasks.errors import SailorError
    from sailor_tasks.ledger import Ledger
    from sailor_tasks.placement import explain, plan
    from sailor_tasks.placement.reservations import ledger_state
    from sailor_tasks.request import from_params

    params = _load_params(args.request, args.set)
    catalog = load_catalog()
    try:
        request = from_params(params, catalog)
        ledger = Ledger(Settings.from_env().ledger_url)
        state = ledger_state(ledger, request, run_id="cli-plan")
        if args.json:  # the whole decision: winner, runners-up, regions, every rejected candidate
            print(json.dumps(explain(request, catalog, state, run_id="cli-plan"), indent=2))
            return 0
        placement = plan(request, catalog, state, run_id="cli-plan")
    except SailorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(placement.explanation))
    return 0


# --- rebalance -----------------------------------------------------------------------------------


def cmd_rebalance(args: argparse.Namespace) -> int:
    """Solve a rebalance scenario without Airflow (a generated one, or a problem JSON file)."""
    from sailor_tasks.errors import RebalanceInfeasibleError
    from sailor_tasks.rebalance.problem import Problem
    from sailor_tasks.rebalance.scenario import generate
    from sailor_tasks.rebalance.solver import solve

    if args.scenario == "generated":
        try:
            problem = generate(
                args.regions,
                args.gpu_types,
                args.teams,
                args.datasets,
                seed=args.seed,
                budget_fraction=args.budget_fraction,
            )
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    elif os.path.isfile(args.scenario):
        with open(args.scenario) as f:
            problem = Problem.from_json(json.load(f))
    else:
        print(
            f"error: --scenario {args.scenario!r} is neither 'generated' nor a problem JSON file",
            file=sys.stderr,
        )
        return 2
    if args.write_scenario:
        with open(args.write_scenario, "w") as f:
            json.dump(problem.to_json(), f)
    try:
        solution = solve(
            problem, seed=args.seed, time_limit_s=args.time_limit, comfort_ratio=args.comfort_ratio
        )
    except RebalanceInfeasibleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    out = solution.to_json() if args.full else solution.summary()
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for key, value in solution.summary().items():
            print(f"{key:24s} {value}")
    return 0


# --- traces --------------------------------------------------------------------------------------


def cmd_trace_gcp(args: argparse.Namespace) -> int:
    """Per-zone preemption stats of the GCP 2020 logs, or one zone as an availability trace JSON."""
    from sailor_tasks.traces.gcp_2020 import load_gcp_logs, to_availability_trace

    try:
        log = load_gcp_logs(args.logs)
        if not args.zone:
            rows = [
                {
                    "zone": z,
                    "preemptions": st.preemptions,
                    "instance_hours": st.instance_hours,
                    "preemptions_per_hour": st.preemptions_per_hour,
                    "stockout_fraction": st.stockout_fraction,
                }
                for z, st in log.zone_stats(args.gpu).items()
            ]
            _print_table(rows, list(rows[0]) if rows else ["zone"])
            return 0
        trace = to_availability_trace(log, args.zone, args.gpu, args.gap)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(
        {"metadata": {"gap_seconds": trace.gap_seconds, "source": trace.source}, "data": trace.data}
    )
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
        print(f"wrote {len(trace.data)} slots, {len(trace.preemption_times())} preemptions to {args.out}")
    else:
        print(text)
    return 0


# --- buckets -------------------------------------------------------------------------------------


def cmd_buckets(args: argparse.Namespace) -> int:
    """List (and with --create, create) the source bucket and one bucket per region."""
    from sailor_tasks import storage
    from sailor_tasks.catalog import load_catalog

    settings = Settings.from_env()
    catalog = load_catalog()
    bad = [r for r in args.region or () if r not in catalog.regions]
    if bad:
        print(
            f"error: --region {', '.join(bad)} not in the catalog; valid: {', '.join(catalog.regions)}",
            file=sys.stderr,
        )
        return 2
    wanted = [(SOURCE_BUCKET, args.source_location), *((r, r) for r in (args.region or catalog.regions))]
    for bucket, location in wanted:
        uri = settings.bucket_uri(bucket)
        created = storage.ensure_bucket(uri, location=location) if args.create else False
        state = "created" if created else ("exists" if args.create else "")
        print(f"{bucket:28s} {uri} {state}".rstrip())
    return 0


# --- render --------------------------------------------------------------------------------------


def cmd_render(args: argparse.Namespace) -> int:
    """Print what a run would submit to the cloud (no cloud call): node pool body, pod manifests."""
    import contextlib

    from sailor_tasks.errors import SailorError

    params = _load_params(args.json, args.set)
    try:
        with contextlib.redirect_stdout(sys.stderr):  # operator logs must not mix with the JSON
            from sailor_tasks.airflow_glue.gcp import render_run
            from sailor_tasks.ledger import Ledger
            from sailor_tasks.model import ClusterState
            from sailor_tasks.request import DEMO_DATASET_URI

            settings = Settings.from_env()
            ledger = Ledger(settings.ledger_url)
            state = ClusterState(  # the same snapshot `plan` would see
                reservations=tuple(ledger.live_reservations()),
                assignment=ledger.latest_assignment(),
                replicas=ledger.replicas([params.get("dataset_uri", DEMO_DATASET_URI)]),
            )
            out = render_run(params, settings, run_id=args.run_id, state=state)
    except (SailorError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(out, indent=2))
    return 0


# --- demo ----------------------------------------------------------------------------------------

DEMO_PARAMS = {
    "job_name": "demo-lm",
    "team": "research",
    "model": "tiny_gpt",
    "num_workers": 2,
    "total_steps": 300,
    "checkpoint_every_steps": 50,
    "market": "auto",
    "max_usd_per_hour": 20.0,
    "seed": 0,
    # Spot resilience: one preemption with notice mid-training, recovered in the next region.
    "inject_preemptions": [150],
    "recovery_strategy": "eager_next_region",
}


def ensure_demo_dataset(settings: Settings) -> str:
    """Create the demo corpus in the source bucket unless a sealed copy is already there."""
    from sailor_tasks import storage
    from sailor_tasks.data.demo import DEMO_DATASET, write_demo_dataset
    from sailor_tasks.data.manifest import read_manifest

    root = storage.resolve(DEMO_DATASET, settings)
    manifest = read_manifest(root)
    if manifest is None:
        manifest = write_demo_dataset(root)
        print(
            f"generated demo dataset: {len(manifest.files)} files, {manifest.total_bytes / 1e6:.1f} MB at {root}"
        )
    return root


def cmd_demo_data(args: argparse.Namespace) -> int:
    ensure_demo_dataset(Settings.from_env())
    return 0


def _airflow(*argv: str) -> int:
    airflow = os.path.join(os.path.dirname(sys.executable), "airflow")
    print(f"$ airflow {' '.join(argv)}", flush=True)
    return subprocess.call([airflow, *argv])


def cmd_demo(args: argparse.Namespace) -> int:
    from sailor_tasks.ledger import Ledger

    settings = Settings.from_env()
    ensure_demo_dataset(settings)
    params = {**DEMO_PARAMS, **(json.loads(args.conf) if args.conf else {})}
    if _airflow("dags", "test", "sailor_train", "-c", json.dumps(params)) != 0:
        print("sailor_train failed; see the log above", file=sys.stderr)
        return 1
    if _airflow("dags", "test", "sailor_rebalance") != 0:
        print("sailor_rebalance failed; see the log above", file=sys.stderr)
        return 1
    ledger = Ledger(settings.ledger_url)
    runs = [r for r in ledger.list_runs(limit=20) if r["job_name"] == params["job_name"]]
    if not runs or runs[0]["status"] != "success":
        print(
            f"the demo run did not succeed: {runs[0]['status'] if runs else 'no run recorded'}",
            file=sys.stderr,
        )
        return 1
    print()
    print(demo_summary(ledger, runs[0]["run_id"], settings))
    return 0


def demo_summary(ledger: Any, run_id: str, settings: Settings) -> str:
    run = ledger.get_run(run_id)
    placement = ledger.placements(run_id, limit=1)[0]
    assignment = ledger.latest_assignment()
    replicas = ledger.replicas([run["dataset_uri"]])
    lines = [
        "=" * 78,
        f"SAILOR demo: run {run_id} — {run['status'].upper()}",
        "=" * 78,
        f"Placed in    {run['region']} / {run['zone']}: {run['num_gpus']}x {run['gpu_type']} ({run['market']}) "
        f"at ${run['usd_per_hour']:.2f}/h",
        *(f"  why        {line}" for line in placement["explanation"]),
        f"Data placed  {run['dataset_uri']} -> regions {', '.join(replicas.get(run['dataset_uri'], ()))}",
        f"Training     {run['steps']} steps of {run['model']}; eval loss {run['initial_loss']:.3f} -> "
        f"{run['final_loss']:.3f}",
        f"Checkpoint   {run['checkpoint_uri']}",
        *recovery_lines(ledger, run_id),
        f"Est. cost    ${run['usd_estimate']:.4f} (price x training wall time on the local backend)",
        f"Rebalance    assignment v{assignment.version if assignment else '-'} published "
        f"({len(assignment.shares) if assignment else 0} teams)",
        f"State        {settings.state_dir} (ledger {settings.ledger_url})",
        "",
        "Next: `make airflow` starts the Airflow UI on http://localhost:8080 (user admin, password admin);",
        "      `.venv/bin/sailor runs` lists runs from the ledger.",
    ]
    return "\n".join(lines)


def recovery_lines(ledger: Any, run_id: str) -> list[str]:
    """The run's attempts and preemptions, for the demo summary (empty when never preempted)."""
    attempts = ledger.attempts(run_id) if hasattr(ledger, "attempts") else []
    preemptions = {p["attempt"]: p for p in ledger.preemptions(run_id)}
    if not preemptions:
        return []
    run = ledger.get_run(run_id)
    req = run.get("request") or {}
    strategy = req.get("recovery_strategy") or req.get("strategy", "?")
    lines = [f"Recovery     {len(preemptions)} preemption(s), {len(attempts)} attempts (strategy {strategy})"]
    for a in attempts:
        where = f"attempt {a['attempt']} in {a['region']}/{a['zone']}"
        start = (
            f"from step {a['resumed_from_step']}" if a["resumed_from_step"] is not None else "from scratch"
        )
        p = preemptions.get(a["attempt"])
        if p:
            rec = f", back to training in {p['recovery_s']:.1f} s" if p["recovery_s"] is not None else ""
            end = (
                f"preempted {'with' if p['noticed'] else 'without'} notice at step {p['step']}: "
                f"{p['steps_lost']} steps lost{rec}"
            )
        else:
            end = f"{a['outcome']} at step {a['step']}"
        lines.append(f"  {where}: started {start}, {end}")
    return lines


# --- simulate ------------------------------------------------------------------------------------


def cmd_simulate(args: argparse.Namespace) -> int:
    from sailor_tasks.cli.simulate import run_simulation

    try:
        result = run_simulation(args)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result))
    else:
        _print_table([result], list(result))
    return 0


# --- submit --------------------------------------------------------------------------------------


def cmd_submit(args: argparse.Namespace) -> int:
    """Trigger ``sailor_train`` through Airflow's REST API with params from a JSON file; follow it."""
    from sailor_tasks.catalog import load_catalog
    from sailor_tasks.cli.airflow_api import AirflowAPIError, AirflowClient
    from sailor_tasks.errors import InvalidRequestError
    from sailor_tasks.request import from_params

    try:
        with open(args.params) as f:
            params = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        print(f"error: cannot read params from {args.params}: {exc}", file=sys.stderr)
        return 2
    if not isinstance(params, dict):
        print(f"error: {args.params} must hold a JSON object of sailor_train params", file=sys.stderr)
        return 2
    if args.dag_id == "sailor_train" and not args.no_check:
        try:  # the same checks validate runs, minus the dataset lookup: fail here, before Airflow
            from_params(params, load_catalog())
        except InvalidRequestError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    password = args.password if args.password is not None else os.environ.get("SAILOR_AIRFLOW_PASSWORD")
    client = AirflowClient(
        args.airflow_url, args.username, password, token=args.token or os.environ.get("SAILOR_AIRFLOW_TOKEN")
    )
    try:
        run = client.trigger(args.dag_id, params, note=args.note)
    except (AirflowAPIError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: cannot reach Airflow at {args.airflow_url}: {exc}", file=sys.stderr)
        return 2
    run_id = run["dag_run_id"]
    print(run_id, flush=True)
    print(f"{args.airflow_url.rstrip('/')}/dags/{args.dag_id}/runs/{run_id}", file=sys.stderr, flush=True)
    if args.no_wait:
        return 0

    def report(state: str, tasks: dict[str, str]) -> None:
        shown = "  ".join(f"{t}={s}" for t, s in tasks.items())
        print(f"[{time.strftime('%H:%M:%S')}] run {state}: {shown}", file=sys.stderr, flush=True)

    try:
        state = client.wait(args.dag_id, run_id, timeout_s=args.timeout, poll_s=args.poll, on_change=report)
    except TimeoutError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    print(state, flush=True)
    if state == "success" and args.dag_id == "sailor_train":
        try:
            summary = client.xcom(args.dag_id, run_id, "finalize")
            print(summary.get("summary_md", ""), file=sys.stderr)
        except AirflowAPIError:
            pass
    return 0 if state == "success" else 1


# --- entrypoint ----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sailor", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("runs", help="list runs recorded in the ledger")
    p.add_argument("--json", action="store_true")
    p.add_argument("--limit", type=int, default=50)
    p.set_defaults(func=cmd_runs)

    p = sub.add_parser("catalog", help="print GPU offers (real GCP prices)")
    p.add_argument("--gpu", help="only this GPU type")
    p.add_argument("--region", action="append", help="only this region (repeatable)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_catalog)
    csub = p.add_subparsers(dest="catalog_command")
    d = csub.add_parser("derive", help="re-derive the packaged offers from a SkyPilot-format GCP catalog CSV")
    d.add_argument("--source", required=True)
    d.add_argument("--dest")
    d.set_defaults(func=cmd_catalog_derive)
    d = csub.add_parser("transfer", help="data transfer USD/GB and Gbit/s between regions (bucket copies)")
    d.add_argument("--region", action="append", help="only these regions (repeatable)")
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=cmd_catalog_transfer)

    p = sub.add_parser("plan", help="place a request (JSON file of sailor_train params and/or --set k=v)")
    p.add_argument("request", nargs="?", help="JSON file with sailor_train params")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one param (JSON value)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser(
        "rebalance", help="solve a rebalance scenario (region shares + replicas) without Airflow"
    )
    p.add_argument(
        "--scenario",
        default="generated",
        help="'generated' (seeded scenario from the options below) or a problem JSON file",
    )
    p.add_argument("--regions", type=int, default=40)
    p.add_argument("--gpu-types", type=int, default=8)
    p.add_argument("--teams", type=int, default=2000)
    p.add_argument("--datasets", type=int, default=10000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget-fraction", type=float, default=0.1, help="byte budget / all dataset bytes")
    p.add_argument("--time-limit", type=float, default=50.0, help="solver time budget in seconds")
    p.add_argument("--comfort-ratio", type=float, default=0.0, help="ratios below it count as balanced")
    p.add_argument("--write-scenario", metavar="PATH", help="also write the problem as JSON")
    p.add_argument("--full", action="store_true", help="print the whole solution (shares, replicas)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_rebalance)

    p = sub.add_parser(
        "trace-gcp", help="GCP 2020 preemption logs: per-zone rates, or --zone as an availability trace"
    )
    p.add_argument("--logs", default="../shared/data/gcp_preemption_2020/logs", help="folder of *.out logs")
    p.add_argument("--zone", help="write this zone's availability trace (JSON) instead of the stats")
    p.add_argument("--gpu", help="only instances of this GPU type (e.g. nvidia-tesla-v100)")
    p.add_argument(
        "--gap", type=float, default=900.0, help="seconds per trace slot (logs pinged every 900 s)"
    )
    p.add_argument("--out", help="output file (default: stdout)")
    p.set_defaults(func=cmd_trace_gcp)

    p = sub.add_parser(
        "buckets", help="list the region buckets of SAILOR_BUCKET_TEMPLATE; --create makes missing ones"
    )
    p.add_argument("--create", action="store_true", help="create missing buckets (gs://: in their region)")
    p.add_argument(
        "--region", action="append", help="only this region (repeatable; default: every catalog region)"
    )
    p.add_argument("--source-location", default="US", help="location of the source bucket (default US)")
    p.set_defaults(func=cmd_buckets)

    p = sub.add_parser(
        "render", help="print the node pool body and pod manifests a gke run of the params would submit"
    )
    p.add_argument("--backend", choices=["gke"], default="gke", help="backend to render for (gke)")
    p.add_argument("--json", metavar="PARAMS_JSON", help="JSON file with sailor_train params")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one param (JSON value)")
    p.add_argument("--run-id", default="manual__render", help="run id the names and labels derive from")
    p.set_defaults(func=cmd_render)

    p = sub.add_parser(
        "submit",
        help="trigger sailor_train through Airflow's REST API with params from a JSON file; follow the run",
    )
    p.add_argument("params", help="JSON file with sailor_train params (the run's conf)")
    p.add_argument("--airflow-url", default=os.environ.get("SAILOR_AIRFLOW_URL", "http://localhost:8080"))
    p.add_argument("--username", default=os.environ.get("SAILOR_AIRFLOW_USERNAME", "admin"))
    p.add_argument("--password", help="default: $SAILOR_AIRFLOW_PASSWORD")
    p.add_argument("--token", help="an access token instead of username/password ($SAILOR_AIRFLOW_TOKEN)")
    p.add_argument("--dag-id", default="sailor_train")
    p.add_argument("--note", help="a note shown on the dag run in the UI")
    p.add_argument("--no-wait", action="store_true", help="print the run id and return")
    p.add_argument("--no-check", action="store_true", help="skip the local params check")
    p.add_argument("--timeout", type=float, default=24 * 3600.0, help="seconds to follow the run")
    p.add_argument("--poll", type=float, default=5.0, help="seconds between state checks")
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("demo-data", help=f"generate the demo dataset in the '{SOURCE_BUCKET}' bucket")
    p.set_defaults(func=cmd_demo_data)

    p = sub.add_parser("simulate", help="simulate a job trace under a scheduling policy (Gavel-style rounds)")
    from sailor_tasks.cli.simulate import add_arguments

    add_arguments(p)
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("demo", help="run sailor_train and sailor_rebalance through Airflow, then summarise")
    p.add_argument("--conf", help="JSON object overriding the demo params")
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
