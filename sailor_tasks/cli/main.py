"""The sailor command: submit, follow, inspect and cancel training runs; plan requests, browse the
catalog, run the demo and the simulators."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from collections.abc import Iterator, Sequence

from sqlalchemy.exc import ArgumentError, DBAPIError

from sailor_tasks.cli import (
    cancel,
    catalog,
    check,
    db,
    demo,
    gke,
    logs,
    plan,
    queue,
    rebalance,
    runs,
    show,
    simulate,
    submit,
    trace,
)
from sailor_tasks.errors import CatalogError, ExitCode, LedgerSchemaError, SettingsError

EXIT_CODES = {
    ExitCode.OK: "ok",
    ExitCode.FAILED: "failed (the run or the action did not succeed)",
    ExitCode.BAD_INPUT: "bad input (arguments, params or credentials)",
    ExitCode.NOT_FOUND: "not found or unreachable (run, DAG, log, Airflow)",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C while following; the run goes on)",
}


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("sailor-tasks")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    epilog = "exit status:\n" + "\n".join(f"  {int(code)}  {what}" for code, what in EXIT_CODES.items())
    parser = argparse.ArgumentParser(
        prog="sailor",
        description=__doc__,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"sailor {version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    submit.add_parser(sub)
    runs.add_parser(sub)
    queue.add_parser(sub)
    show.add_parser(sub)
    logs.add_parser(sub)
    cancel.add_parser(sub)
    check.add_parser(sub)
    catalog.add_parser(sub)
    plan.add_parser(sub)
    rebalance.add_parser(sub)
    trace.add_parser(sub)
    gke.add_parser(sub)  # buckets, render
    demo.add_data_parser(sub)  # demo-data
    db.add_parser(sub)  # current, upgrade, revision
    simulate.add_parser(sub)
    demo.add_parser(sub)
    return parser


def walk(
    parser: argparse.ArgumentParser, path: str = "sailor"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """(command path, parser) for ``parser`` and every subcommand under it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from walk(sub, f"{path} {name}")


def options_without_help(parser: argparse.ArgumentParser | None = None) -> list[str]:
    """``"sailor COMMAND --option"`` for every option or positional argument that has no help."""
    missing = []
    for path, p in walk(parser or build_parser()):
        for action in p._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            if not action.help or action.help == argparse.SUPPRESS:
                missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    return missing


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except CatalogError as exc:  # SAILOR_CATALOG_FILE / SAILOR_SUPPLY_FILE, for every command
        print(f"error: the catalog cannot be loaded: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    except SettingsError as exc:  # a SAILOR_* variable, for every command
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    except (DBAPIError, ArgumentError, LedgerSchemaError) as exc:  # the ledger of every command
        return _ledger_error(exc, getattr(args, "ledger_url", None))
    except ImportError as exc:
        if not _from_sqlalchemy(exc):
            raise
        return _ledger_error(exc, getattr(args, "ledger_url", None))
    except BrokenPipeError:
        # The reader went away (`sailor runs | head`): no traceback, and none at exit either, when
        # Python flushes stdout into the closed pipe.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return ExitCode.FAILED


def _from_sqlalchemy(exc: BaseException) -> bool:
    """The import failed inside SQLAlchemy: the database driver a ledger URL names is missing."""
    tb = exc.__traceback__
    while tb is not None:
        if "/sqlalchemy/" in tb.tb_frame.f_code.co_filename:
            return True
        tb = tb.tb_next
    return False


def _ledger_error(exc: Exception, given_url: str | None = None) -> int:
    """A clear line, not a traceback, for a ledger that cannot be used: a URL SQLAlchemy cannot use
    or whose driver is not installed, a ledger this SAILOR's schema cannot use (bad input), or a
    database it cannot reach or use (not found). ``given_url``: the command's ``--ledger-url``."""
    from sailor_tasks.settings import Settings

    settings = Settings.from_env()
    if given_url:
        settings = dataclasses.replace(settings, ledger_url=given_url)
    url = settings.ledger_url_redacted
    where = f"--ledger-url {url!r}" if given_url else f"SAILOR_LEDGER_URL={url!r}"
    if isinstance(exc, ArgumentError):
        print(f"error: {where} is not a usable SQLAlchemy URL: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    if isinstance(exc, ImportError):
        print(f"error: {where}: its database driver is not installed ({exc})", file=sys.stderr)
        return ExitCode.BAD_INPUT
    if isinstance(exc, LedgerSchemaError):
        print(f"error: cannot use the ledger at {url}: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    orig = getattr(exc, "orig", None)
    reason = (str(orig).strip().splitlines() or [type(orig).__name__])[0] if orig is not None else str(exc)
    print(f"error: cannot use the ledger at {url}: {reason}", file=sys.stderr)
    return ExitCode.NOT_FOUND


if __name__ == "__main__":
    sys.exit(main())
