"""``sailor plan``: place a request against the catalog and the ledger's cluster state."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from sailor_tasks.cli.output import load_params, print_json
from sailor_tasks.errors import ExitCode
from sailor_tasks.settings import Settings


def add_parser(sub: Any) -> None:
    p = sub.add_parser("plan", help="place a request (JSON file of sailor_train params and/or --set k=v)")
    p.add_argument("request", nargs="?", help="JSON file with sailor_train params")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one param (JSON value)")
    p.add_argument(
        "--json",
        action="store_true",
        help="print JSON: the winner, runners-up, regions and every rejected candidate",
    )
    p.set_defaults(func=cmd_plan)


def cmd_plan(args: argparse.Namespace) -> int:
    """Plan as the ``plan`` stage plans a first launch: the catalog with the preemption rates
    learned from the ledger's spot attempts, the throughputs measured by past runs, the dataset's
    size and the residency other runs of it declared, on the market the run's strategy chooses
    (``decide_market``). Nothing is reserved."""
    from sailor_tasks import storage
    from sailor_tasks.data.manifest import read_manifest
    from sailor_tasks.errors import SailorError
    from sailor_tasks.placement import explain, plan
    from sailor_tasks.placement.index import index_for
    from sailor_tasks.placement.reservations import ledger_state
    from sailor_tasks.request import dataset_key, from_params
    from sailor_tasks.stages import StageContext
    from sailor_tasks.stages.queueing import with_dataset_residency
    from sailor_tasks.strategies.live import decide_market

    try:
        params = load_params(args.request, args.set)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    ctx = StageContext(Settings.from_env())
    offered = ctx.catalog  # a catalog that cannot be loaded is main()'s error, as for every command
    try:
        request = from_params(params, offered)
        # The dataset's one key (its replicas and residency), as validate stores it.
        request = dataclasses.replace(
            request, dataset_uri=dataset_key(request.dataset_uri, ctx.settings, offered.regions)
        )
        request = with_dataset_residency(ctx, request)
        catalog = ctx.planning_catalog()
        index = index_for(catalog, ctx.planning_table())
        try:
            manifest = read_manifest(storage.resolve(request.dataset_uri, ctx.settings))
        except (SailorError, OSError):  # not readable from here: the largest recorded replica
            manifest = None
        nbytes = manifest.total_bytes if manifest is not None else None
        state = ledger_state(ctx.ledger, request, "cli-plan", nbytes)
        decision = decide_market(request, catalog, state, index=index)
        request = dataclasses.replace(request, market=decision.market)
        if args.json:  # the whole decision: winner, runners-up, regions, every rejected candidate
            explained = explain(request, catalog, state, run_id="cli-plan", index=index)
            print_json(
                {**explained, "market_decision": {"market": decision.market, "reason": decision.reason}}
            )
            return ExitCode.BAD_INPUT if explained.get("error") else ExitCode.OK
        placement = plan(request, catalog, state, run_id="cli-plan", index=index)
    except SailorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    print(f"market: {decision.reason}")
    print("\n".join(placement.explanation))
    return ExitCode.OK
