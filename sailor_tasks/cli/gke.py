"""``sailor buckets`` and ``sailor render``: the cloud side of a run (region buckets, GKE manifests)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from sailor_tasks.cli.output import load_params, print_json
from sailor_tasks.settings import SOURCE_BUCKET, Settings


def add_parser(sub: Any) -> None:
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
    p.add_argument(
        "--params", metavar="FILE", help="JSON file with sailor_train params (output is always JSON)"
    )
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one param (JSON value)")
    p.add_argument("--run-id", default="manual__render", help="run id the names and labels derive from")
    p.set_defaults(func=cmd_render)


def cmd_buckets(args: argparse.Namespace) -> int:
    """List (and with --create, create) the source bucket and one bucket per region."""
    from sailor_tasks import storage
    from sailor_tasks.catalog import load_catalog

    settings = Settings.from_env()
    if "{project}" in settings.bucket_template:
        from sailor_tasks.airflow_glue.gcp import install_for_command

        install_for_command()  # the Airflow connection's project fills {project}
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
        try:
            uri = settings.bucket_uri(bucket)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        created = storage.ensure_bucket(uri, location=location) if args.create else False
        state = "created" if created else ("exists" if args.create else "")
        print(f"{bucket:28s} {uri} {state}".rstrip())
    return 0


def cmd_render(args: argparse.Namespace) -> int:
    """Print what a run would submit to the cloud (no cloud call): node pool body, pod manifests."""
    import contextlib

    from sailor_tasks.errors import SailorError

    try:
        params = load_params(args.params, args.set)
        with contextlib.redirect_stdout(sys.stderr):  # operator logs must not mix with the JSON
            from sailor_tasks.airflow_glue.gcp import install_for_command, render_run
            from sailor_tasks.catalog import load_catalog
            from sailor_tasks.ledger import Ledger
            from sailor_tasks.model import ClusterState
            from sailor_tasks.request import dataset_key, from_params

            install_for_command()  # the Airflow connection's project names the clusters and buckets
            settings = Settings.from_env()
            # The params checked before the ledger is read (nothing is made or upgraded for it).
            catalog = load_catalog()
            request = from_params({**params, "backend": "gke"}, catalog)
            dataset = dataset_key(request.dataset_uri, settings, catalog.regions)
            params = {**params, "dataset_uri": dataset}  # its one key, as validate stores it
            ledger = Ledger.for_reading(settings.ledger_url)
            state = ClusterState()  # nothing recorded yet: an empty snapshot
            if ledger is not None:
                try:  # the same snapshot `plan` would see
                    state = ClusterState(
                        reservations=tuple(ledger.live_reservations()),
                        assignment=ledger.latest_assignment(),
                        replicas=ledger.replicas([dataset]),
                    )
                finally:
                    ledger.dispose()
            out = render_run(params, settings, run_id=args.run_id, state=state)
    except (SailorError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print_json(out)
    return 0
