"""The ledger's schema under alembic: every change to ``schema.py`` ships as a revision in
``migrations/versions/``, and a ledger (SQLite or PostgreSQL) is upgraded to the newest one (the
head) when SAILOR opens it or by ``sailor db upgrade``.

A ledger with no ``alembic_version`` table (an empty database, or one made by ``create_all`` before
the ledger had migrations) is brought to the head from the baseline revision, whose tables and
indexes are created only where missing, so its rows stay as they are."""

from __future__ import annotations

import functools
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import MetaData, create_engine, event, inspect
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from sailor_tasks.errors import LedgerSchemaError
from sailor_tasks.ledger.schema import metadata as ledger_metadata

MIGRATIONS = Path(__file__).with_name("migrations")
"""The alembic environment: ``env.py``, ``script.py.mako`` and ``versions/``."""

FILE_TEMPLATE = "%%(year)d_%%(month).2d_%%(day).2d_%%(rev)s_%%(slug)s"
"""Revision file names start with their date, so ``versions/`` lists them in the order written."""

VERSION_TABLE = "alembic_version"
_PG_LOCK_KEY = zlib.crc32(b"sailor-ledger-migrations")
"""PostgreSQL advisory lock held while one process migrates (others wait, then find the head)."""
_THREAD_LOCK = threading.RLock()
"""Alembic's ``context`` and ``op`` are module globals: one migration at a time per process."""


def config(
    script_location: Path | None = None,
    *,
    connection: Connection | None = None,
    url: str | None = None,
    target_metadata: MetaData | None = None,
) -> Config:
    """An alembic ``Config`` for the ledger's environment (no ``alembic.ini``)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(script_location or MIGRATIONS))
    cfg.set_main_option("file_template", FILE_TEMPLATE)
    if url is not None:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    if connection is not None:
        cfg.attributes["connection"] = connection
    if target_metadata is not None:
        cfg.attributes["target_metadata"] = target_metadata
    return cfg


@functools.lru_cache(maxsize=8)
def _script(script_location: Path) -> ScriptDirectory:
    return ScriptDirectory.from_config(config(script_location))


def script_directory(script_location: Path | None = None) -> ScriptDirectory:
    return _script(Path(script_location or MIGRATIONS))


def head_revision(script_location: Path | None = None) -> str:
    """The newest revision. Two heads (two schema changes written in parallel, both after the same
    revision) are an error naming both files and the fix."""
    script = script_directory(script_location)
    heads = script.get_heads()
    if len(heads) != 1:
        files = ", ".join(f"{h} ({Path(script.get_revision(h).path).name})" for h in sorted(heads))
        raise LedgerSchemaError(
            f"the ledger's migrations have {len(heads)} heads: {files}; set the later revision's "
            "down_revision to the other one so they form one chain (docs/ledger.md)"
        )
    return heads[0]


def revisions(script_location: Path | None = None) -> list[str]:
    """Every revision id, oldest first."""
    script = script_directory(script_location)
    return [s.revision for s in reversed(list(script.walk_revisions()))]


def current_revision(conn: Connection) -> str | None:
    """The revision the ledger is at (None: never migrated)."""
    return MigrationContext.configure(conn).get_current_revision()


@dataclass(frozen=True)
class Status:
    current: str | None
    head: str
    tables: tuple[str, ...]

    @property
    def up_to_date(self) -> bool:
        return self.current == self.head


def status(engine: Engine, script_location: Path | None = None) -> Status:
    head = head_revision(script_location)
    with engine.connect() as conn:
        current = current_revision(conn)
        tables = tuple(sorted(n for n in inspect(conn).get_table_names() if n != VERSION_TABLE))
    return Status(current, head, tables)


def sqlite_write_locking_engine(url: Any, **kwargs: Any) -> Engine:
    """An engine on the SQLite file ``url`` whose transactions take the write lock at BEGIN
    (``BEGIN IMMEDIATE``) and hold DDL too: pysqlite runs DDL outside any transaction it opened
    itself and begins lazily, so the driver is put in autocommit and SAILOR emits the BEGIN.
    Writers wait up to 60 s for the lock. ``kwargs`` go to ``create_engine``."""
    engine = create_engine(url, connect_args={"timeout": 60}, **kwargs)

    @event.listens_for(engine, "connect")
    def _driver_autocommit(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None

    @event.listens_for(engine, "begin")
    def _begin_immediate(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


@contextmanager
def _migration_connection(engine: Engine) -> Iterator[Connection]:
    """A connection in a transaction that holds the revision's DDL too, so a revision that fails
    half-way leaves nothing of itself; concurrent processes migrate one after the other (an
    advisory lock on PostgreSQL, the write lock taken at ``BEGIN IMMEDIATE`` on SQLite)."""
    if engine.dialect.name == "sqlite" and engine.url.database not in (None, "", ":memory:"):
        transactional = sqlite_write_locking_engine(engine.url, poolclass=NullPool)
        try:
            with transactional.begin() as conn:
                yield conn
        finally:
            transactional.dispose()
        return
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_PG_LOCK_KEY})")
        yield conn


def check_revision(revision: str, script_location: Path | None = None) -> None:
    """Refuse a target revision this SAILOR does not know (before anything is opened or made).

    Raises:
        LedgerSchemaError: names the revision and the valid ones.
    """
    known = set(revisions(script_location)) | {"head", "heads"}
    if revision not in known:
        raise LedgerSchemaError(
            f"unknown ledger revision {revision!r}; valid: head, " + ", ".join(revisions(script_location))
        )
    if revision == "head":
        head_revision(script_location)  # two heads: the clear error, not alembic's


def upgrade(
    engine: Engine,
    revision: str = "head",
    *,
    script_location: Path | None = None,
    target_metadata: MetaData | None = None,
) -> tuple[str | None, str | None]:
    """Upgrade the ledger to ``revision``; returns (revision before, revision after)."""
    check_revision(revision, script_location)
    with _THREAD_LOCK, _migration_connection(engine) as conn:
        before = current_revision(conn)
        _check_known(before, script_location)
        cfg = config(script_location, connection=conn, target_metadata=target_metadata)
        command.upgrade(cfg, revision)
        return before, current_revision(conn)


def _check_known(current: str | None, script_location: Path | None) -> None:
    if current is not None and current not in revisions(script_location):
        raise LedgerSchemaError(
            f"the ledger is at revision {current!r}, which this SAILOR does not know (its newest is "
            f"{head_revision(script_location)!r}): it was migrated by a newer SAILOR; run that "
            "version, or upgrade this one"
        )


def missing_sqlite_file(url: str) -> bool:
    """Whether ``url`` names a SQLite file that does not exist (yet)."""
    import os

    from sqlalchemy.engine import make_url

    u = make_url(url)
    return (
        u.get_backend_name() == "sqlite"
        and u.database not in (None, "", ":memory:")
        and not os.path.exists(u.database)
    )


def check_current(engine: Engine) -> None:
    """Raise ``LedgerSchemaError`` unless the ledger is at this SAILOR's newest revision (for a
    process that reads it and must not upgrade it)."""
    head = head_revision()
    with engine.connect() as conn:
        current = current_revision(conn)
    if current == head:
        return
    _check_known(current, None)
    raise LedgerSchemaError(
        f"the ledger is at revision {current or '(none)'}, behind this SAILOR's {head!r}: "
        "`sailor db upgrade` brings it up (a command that only reads the ledger changes nothing)"
    )


def ensure_current(engine: Engine, attempts: int = 5) -> None:
    """Bring the ledger to the head unless it is there already (one query when it is). Processes
    racing on a new ledger retry: PostgreSQL serialises them with a lock; on SQLite the loser of a
    race finds the winner's tables (created only where missing) and revision."""
    head = head_revision()
    for attempt in range(attempts):
        try:
            with engine.connect() as conn:
                current = current_revision(conn)
            if current == head:
                return
            _check_known(current, None)
            with _THREAD_LOCK:
                upgrade(engine)
            return
        except (DBAPIError, CommandError):
            if attempt == attempts - 1:
                raise
            time.sleep(0.2 * (attempt + 1))


def schema_diff(engine: Engine, target_metadata: MetaData | None = None) -> list[Any]:
    """What differs between the ledger's tables and the models (alembic's ``compare_metadata``,
    types included); empty when the migrations produce exactly the models."""
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        return [
            d
            for d in compare_metadata(
                ctx, target_metadata if target_metadata is not None else ledger_metadata
            )
            if not _is_version_table(d)
        ]


def _is_version_table(diff: Any) -> bool:
    return isinstance(diff, tuple) and diff[0] == "remove_table" and diff[1].name == VERSION_TABLE


def new_revision(
    message: str,
    *,
    script_location: Path | None = None,
    target_metadata: MetaData | None = None,
) -> Path:
    """Write a revision for what the models have and the head does not: autogenerated against a
    scratch SQLite ledger upgraded to the head. Review it before committing (renames come out as a
    drop and an add; data moves are written by hand). Nothing is written when there is no change."""
    if not message.strip():
        raise LedgerSchemaError("a revision needs a message saying what changes, e.g. 'add leases table'")
    location = Path(script_location or MIGRATIONS)
    with tempfile.TemporaryDirectory(prefix="sailor-ledger-revision-") as tmp:
        engine = create_engine(f"sqlite:///{tmp}/scratch.db")
        try:
            upgrade(engine, script_location=location, target_metadata=target_metadata)
            if not schema_diff(engine, target_metadata):
                raise LedgerSchemaError(
                    "the models (sailor_tasks/ledger/schema.py) match the newest revision: no revision "
                    "to write"
                )
            with engine.begin() as conn:
                cfg = config(location, connection=conn, target_metadata=target_metadata)
                script = command.revision(cfg, message=message, autogenerate=True)
        finally:
            engine.dispose()
    _script.cache_clear()
    return Path(script.path)
