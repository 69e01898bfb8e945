"""``sailor check``: every prerequisite of a backend, checked for real, with ✔/✘ and the fix."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import sys
from typing import Any

from sailor_tasks.cli.output import print_json
from sailor_tasks.errors import ExitCode
from sailor_tasks.settings import BACKENDS

MARKS = {"ok": "✔", "failed": "✘", "unreachable": "✘"}


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "check",
        help="check a backend's prerequisites (state, ledger, torchrun, DAGs; GCP connection, project, "
        "buckets, image, GPU quota, APIs) and print the fix for each one that fails",
    )
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        default=None,
        help="backend to check (default: SAILOR_BACKEND, else local)",
    )
    p.add_argument(
        "--region",
        action="append",
        help="gke: only this region's buckets, image and quota (repeatable; default: every catalog region)",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument(
        "--write-supply",
        metavar="FILE",
        help="gke: write a supply file (docs/configuration.md#supply-file) whose capacities are the "
        "GPU quotas read; point SAILOR_SUPPLY_FILE at it",
    )
    p.set_defaults(func=cmd_check)


def exit_code(checks: list[Any]) -> ExitCode:
    """0 all hold; 1 one failed; 3 none failed but one could not be reached."""
    if any(c.status == "failed" for c in checks):
        return ExitCode.FAILED
    if any(c.status == "unreachable" for c in checks):
        return ExitCode.NOT_FOUND
    return ExitCode.OK


def format_checks(backend: str, checks: list[Any]) -> list[str]:
    width = max(len(c.name) for c in checks)
    lines = [f"sailor check --backend {backend}"]
    for c in checks:
        lines.append(f"  {MARKS[c.status]} {c.name.ljust(width)}  {c.detail}")
        if not c.ok:
            lines.append(f"    {' ' * width}  fix: {c.fix}")
    bad = sum(not c.ok for c in checks)
    lines.append(f"{len(checks) - bad} of {len(checks)} prerequisites hold" + ("" if bad else "; ready"))
    return lines


def cmd_check(args: argparse.Namespace) -> int:
    from sailor_tasks.settings import Settings

    try:
        settings = Settings.from_env()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    backend = args.backend or settings.backend
    if backend != "gke" and (args.region or args.write_supply):
        print(
            f"error: --region and --write-supply check GCP; use them with --backend gke, not {backend}",
            file=sys.stderr,
        )
        return ExitCode.BAD_INPUT
    if args.write_supply:
        folder = os.path.dirname(os.path.abspath(args.write_supply))
        if not os.path.isdir(folder):
            print(
                f"error: --write-supply {args.write_supply}: folder {folder} does not exist", file=sys.stderr
            )
            return ExitCode.BAD_INPUT
    from sailor_tasks.catalog import load_catalog

    try:
        catalog = load_catalog()
    except (OSError, ValueError) as exc:  # SAILOR_CATALOG_FILE or SAILOR_SUPPLY_FILE unreadable
        print(f"error: the catalog cannot be loaded: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    bad = [r for r in args.region or () if r not in catalog.regions]
    if bad:
        print(
            f"error: --region {', '.join(bad)} not in the catalog; valid: {', '.join(catalog.regions)}",
            file=sys.stderr,
        )
        return ExitCode.BAD_INPUT

    from sailor_tasks.airflow_glue.check import backend_checks

    quotas: list[Any] = []
    with contextlib.redirect_stdout(sys.stderr):  # library chatter must not mix with --json
        checks = backend_checks(backend, settings, regions=args.region, catalog=catalog, quotas_read=quotas)
    code = exit_code(checks)
    supply_file = None
    if args.write_supply:
        supply_file, message = write_supply(args.write_supply, quotas, catalog, settings)
        print(message, file=sys.stderr)
        if supply_file is None and code == ExitCode.OK:
            code = ExitCode.FAILED
    if args.json:
        out = {
            "backend": backend,
            "ok": all(c.ok for c in checks),
            "checks": [c.to_dict() for c in checks],
            "supply_file": supply_file,
        }
        print_json(out)
    else:
        print("\n".join(format_checks(backend, checks)))
    return code


def write_supply(path: str, quotas: list[Any], catalog: Any, settings: Any) -> tuple[str | None, str]:
    """Write the supply file from the quotas read; (path, message), or (None, why not)."""
    import yaml

    from sailor_tasks.backends.checks import supply_from_quotas
    from sailor_tasks.catalog.supply import load_supply, parse_supply

    if not quotas:
        return None, f"supply file not written: no GPU quota was read (see the checks); {path} unchanged"
    failed = [q.region for q in quotas if q.error]
    if failed:
        return None, (
            f"supply file not written: the quotas of {', '.join(failed)} could not be read; {path} unchanged"
        )
    doc = supply_from_quotas(
        quotas,
        catalog,
        load_supply(),
        project=settings.gcp_project,
        today=dt.datetime.now(dt.UTC).date().isoformat(),
    )
    try:
        parse_supply(doc)  # the file loads as a supply file
    except ValueError as exc:
        return None, f"supply file not written: {exc}; {path} unchanged"
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            f.write(
                "# SAILOR supply file written by `sailor check --write-supply` from the project's GPU quotas\n"
                "# (docs/configuration.md#supply-file); `source.quotas_per_region` holds the quotas read.\n"
            )
            yaml.safe_dump(doc, f, sort_keys=False)
        os.replace(tmp, path)
    except OSError as exc:  # a folder at that path, no permission, a full disk: nothing left behind
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        return None, f"supply file not written: {path}: {exc}"
    regions = sorted({q.region for q in quotas})
    return (
        path,
        f"wrote {path}: capacities from the GPU quotas of {len(regions)} regions (SAILOR_SUPPLY_FILE={path})",
    )
