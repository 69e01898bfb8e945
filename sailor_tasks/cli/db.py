"""``sailor db``: the ledger's schema revision: show it, upgrade it, write a new revision."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from sqlalchemy.exc import DBAPIError

from sailor_tasks.errors import ExitCode
from sailor_tasks.settings import Settings


def add_parser(sub: Any) -> None:
    p = sub.add_parser("db", help="the ledger's schema: current revision, upgrade, new revision")
    db = p.add_subparsers(dest="db_command", required=True, metavar="ACTION")

    current = db.add_parser("current", help="the ledger's revision, the newest one and the tables")
    current.add_argument("--json", action="store_true", help="print JSON")
    current.set_defaults(func=cmd_current)

    upgrade = db.add_parser("upgrade", help="upgrade the ledger to the newest revision (or --revision)")
    upgrade.add_argument(
        "--revision", default="head", help="revision to upgrade to (default head: the newest)"
    )
    upgrade.set_defaults(func=cmd_upgrade)

    revision = db.add_parser(
        "revision",
        help="write a revision for what sailor_tasks/ledger/schema.py has and the newest revision lacks",
    )
    revision.add_argument("-m", "--message", required=True, help="what the revision changes")
    revision.set_defaults(func=cmd_revision)

    for action in (current, upgrade):
        action.add_argument(
            "--ledger-url",
            help="SQLAlchemy URL of the ledger (default: $SAILOR_LEDGER_URL or the state folder's ledger.db)",
        )


def _settings(args: argparse.Namespace) -> Settings:
    """The settings, with ``--ledger-url`` when given.

    Raises:
        SettingsError: ``--ledger-url`` is not a SQLAlchemy URL (named, its password redacted).
    """
    settings = Settings.from_env()
    if getattr(args, "ledger_url", None):
        from dataclasses import replace

        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        from sailor_tasks.errors import SettingsError

        settings = replace(settings, ledger_url=args.ledger_url)
        try:
            make_url(args.ledger_url)
        except ArgumentError as exc:
            raise SettingsError(
                f"--ledger-url {settings.ledger_url_redacted!r} is not a usable SQLAlchemy URL: {exc} "
                "(e.g. postgresql+psycopg2://user:password@host/db or sqlite:////path/ledger.db)"
            ) from None
    return settings


def _unreachable(settings: Settings, exc: DBAPIError) -> int:
    reason = str(exc.orig).strip().splitlines()[0] if exc.orig is not None else type(exc).__name__
    print(f"error: cannot use the ledger at {settings.ledger_url_redacted}: {reason}", file=sys.stderr)
    return ExitCode.NOT_FOUND


def cmd_current(args: argparse.Namespace) -> int:
    from sqlalchemy import create_engine

    from sailor_tasks.errors import LedgerSchemaError
    from sailor_tasks.ledger import migrate
    from sailor_tasks.ledger.store import open_engine

    settings = _settings(args)
    missing = migrate.missing_sqlite_file(settings.ledger_url)
    # A ledger file that does not exist yet reads as an empty database; nothing is created.
    engine = create_engine("sqlite://") if missing else open_engine(settings.ledger_url)
    try:
        status = migrate.status(engine)
    except LedgerSchemaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.FAILED
    except DBAPIError as exc:
        return _unreachable(settings, exc)
    finally:
        engine.dispose()
    if args.json:
        print(
            json.dumps(
                {
                    "ledger": settings.ledger_url_redacted,
                    "current": status.current,
                    "head": status.head,
                    "up_to_date": status.up_to_date,
                    "tables": list(status.tables),
                },
                indent=2,
            )
        )
        return ExitCode.OK
    state = "up to date" if status.up_to_date else "behind: run `sailor db upgrade`"
    print(f"ledger:   {settings.ledger_url_redacted}" + (" (no such file yet)" if missing else ""))
    print(f"revision: {status.current or '(none)'}")
    print(f"head:     {status.head} ({state})")
    print(f"tables:   {len(status.tables)}")
    return ExitCode.OK


def cmd_upgrade(args: argparse.Namespace) -> int:
    from sailor_tasks.errors import LedgerSchemaError
    from sailor_tasks.ledger import migrate
    from sailor_tasks.ledger.store import open_engine

    settings = _settings(args)
    try:  # before the engine: opening a SQLite ledger makes its folder
        migrate.check_revision(args.revision)
    except LedgerSchemaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    engine = open_engine(settings.ledger_url)
    try:
        before, after = migrate.upgrade(engine, args.revision)
    except LedgerSchemaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    except DBAPIError as exc:
        return _unreachable(settings, exc)
    finally:
        engine.dispose()
    if before == after:
        print(f"ledger {settings.ledger_url_redacted} is at {after}: nothing to upgrade")
    else:
        print(f"ledger {settings.ledger_url_redacted} upgraded from {before or '(none)'} to {after}")
    return ExitCode.OK


def cmd_revision(args: argparse.Namespace) -> int:
    from sailor_tasks.errors import LedgerSchemaError
    from sailor_tasks.ledger import migrate

    try:
        path = migrate.new_revision(args.message)
    except LedgerSchemaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    print(f"wrote {path}: review it, then run tests/ledger/test_migrations.py")
    return ExitCode.OK
