"""``sailor catalog`` (GPU offers), ``catalog derive`` and ``catalog transfer``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from sailor_tasks.cli.output import print_json, print_table
from sailor_tasks.errors import ExitCode


def add_parser(sub: Any) -> None:
    p = sub.add_parser("catalog", help="print GPU offers (real GCP prices)")
    p.add_argument("--gpu", help="only this GPU type")
    p.add_argument("--region", action="append", help="only this region (repeatable)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument(
        "--prior",
        action="store_true",
        help="preemption rates of the supply file only (default: updated with the ledger's observations)",
    )
    p.set_defaults(func=cmd_catalog)
    csub = p.add_subparsers(dest="catalog_command")
    d = csub.add_parser("derive", help="re-derive the packaged offers from a SkyPilot-format GCP catalog CSV")
    d.add_argument("--source", required=True, help="SkyPilot-format GCP catalog CSV (vms.csv)")
    d.add_argument("--dest", help="where to write the derived offers (default: the packaged catalog file)")
    d.set_defaults(func=cmd_catalog_derive)
    d = csub.add_parser("transfer", help="data transfer USD/GB and Gbit/s between regions (bucket copies)")
    # SUPPRESS: given before ``transfer`` (``catalog --json transfer``) they still count.
    d.add_argument(
        "--region", action="append", default=argparse.SUPPRESS, help="only these regions (repeatable)"
    )
    d.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")
    d.set_defaults(func=cmd_catalog_transfer)


def _not_read(args: argparse.Namespace, command: str, options: tuple[str, ...]) -> int | None:
    """Exit 2 naming the options of ``catalog`` that ``catalog <command>`` does not read, if given."""
    given = [f"--{o}" for o in options if getattr(args, o, None)]
    if given:
        print(f"error: {', '.join(given)}: not read by `sailor catalog {command}`", file=sys.stderr)
        return ExitCode.BAD_INPUT
    return None


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
    learned = {} if args.prior else _learned(catalog)
    rows = []
    for o in sorted(offers, key=lambda o: (o.gpu_type, o.spot_usd_per_hour)):
        row = to_dict(o)
        rate = learned.get((o.zone, o.gpu_type))
        row["preemption_prior_per_hour"] = o.preemption_rate_per_hour
        row["preemptions_observed"] = rate.preemptions if rate else 0
        row["spot_vm_hours_observed"] = round(rate.vm_hours, 3) if rate else 0.0
        if rate is not None:
            row["preemption_rate_per_hour"] = round(rate.rate, 6)
        rows.append(row)
    if args.json:
        print_json(rows)
    else:
        print_table(
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
                "preemption_prior_per_hour",
                "preemptions_observed",
                "spot_vm_hours_observed",
            ),
        )
    return 0


def _learned(catalog: Any) -> dict:
    """(zone, GPU type) → the learned rate, from the ledger's spot attempts ({} without a ledger)."""
    from sailor_tasks.catalog.learned import learned_rates
    from sailor_tasks.ledger import Ledger
    from sailor_tasks.settings import Settings

    ledger = Ledger.for_reading(Settings.from_env().ledger_url)
    if ledger is None:
        return {}
    try:
        return learned_rates(catalog, ledger.spot_observations())
    finally:
        ledger.dispose()


def cmd_catalog_transfer(args: argparse.Namespace) -> int:
    from sailor_tasks.catalog import load_catalog

    if (refused := _not_read(args, "transfer", ("gpu", "prior"))) is not None:
        return refused
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
        print_json(rows)
    else:
        print_table(
            rows, ("src_region", "dst_region", "usd_per_gb", "gbps", "src_continent", "dst_continent")
        )
    return 0


def cmd_catalog_derive(args: argparse.Namespace) -> int:
    from importlib import resources

    from sailor_tasks.catalog.derive import derive_file
    from sailor_tasks.catalog.offers import DEFAULT_OFFERS_FILE

    if (refused := _not_read(args, "derive", ("gpu", "region", "json", "prior"))) is not None:
        return refused

    dest = args.dest or str(resources.files("sailor_tasks.catalog").joinpath("data", DEFAULT_OFFERS_FILE))
    try:
        n = derive_file(args.source, dest)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}; {dest} is unchanged", file=sys.stderr)
        return ExitCode.BAD_INPUT
    print(f"wrote {n} offers to {dest}")
    return 0
