"""The ledger's schema under alembic: the head equals the models, every revision upgrades a ledger
with rows in it and loses none, a ledger written before the ledger had migrations (``create_all``,
no ``alembic_version``) is adopted with its rows, and the documented way to add a revision works."""

from __future__ import annotations

import datetime as dt
import re
import shutil
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    DateTime,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    create_engine,
    insert,
    inspect,
    select,
    text,
)

from sailor_tasks.errors import LedgerSchemaError
from sailor_tasks.ledger import Ledger, migrate
from sailor_tasks.ledger import schema as ledger_schema
from sailor_tasks.model import Reservation

DATA = Path(__file__).with_name("data")
PRE_MIGRATIONS_DUMP = DATA / "pre_migrations_ledger.sql"
"""A SQLite ledger as SAILOR wrote it through ``Ledger`` with ``create_all`` and no alembic: 13
tables, 31 rows (runs, placements, reservations, attempts, markets, preemptions, an assignment, a
replica, a rebalance night, a GPU allocation)."""


def _sqlite(tmp_path: Path, name: str = "ledger.db") -> str:
    return f"sqlite:///{tmp_path / name}"


def _snapshot(engine) -> dict[str, list[tuple]]:
    """Every row of every table (the version table aside), as reflected, in a stable order."""
    meta = MetaData()
    meta.reflect(engine)
    out = {}
    with engine.connect() as conn:
        for name, table in meta.tables.items():
            if name == migrate.VERSION_TABLE:
                continue
            rows = conn.execute(select(table)).mappings().all()
            out[name] = sorted((tuple(sorted((k, repr(v)) for k, v in r.items())) for r in rows), key=repr)
    return out


def _value(column, i: int):
    """A value of ``column``'s type for row ``i``; key columns get ``i`` (as text for strings), so
    rows referring to ``runs.run_id`` find the run of the same number."""
    kind = column.type.python_type if not isinstance(column.type, JSON) else dict
    if kind is bool:
        return i % 2 == 0
    if kind is int:
        return i
    if kind is float:
        return i + 0.25
    if kind is dt.datetime:
        return dt.datetime(2026, 11, 20, tzinfo=dt.UTC) + dt.timedelta(hours=i)
    if kind is dict:
        return {"row": i, "values": [i, i + 1]}
    return str(i)


def _fill(engine, rows: int = 3) -> None:
    """``rows`` rows in every table the ledger has, every column set (nullable ones too)."""
    meta = MetaData()
    meta.reflect(engine)
    with engine.begin() as conn:
        for table in meta.sorted_tables:
            if table.name == migrate.VERSION_TABLE:
                continue
            conn.execute(
                insert(table), [{c.name: _value(c, i) for c in table.columns} for i in range(1, rows + 1)]
            )


def _rows_kept(before: dict[str, list[tuple]], after: dict[str, list[tuple]]) -> None:
    """Every table and row of ``before`` is in ``after`` with the same values in the columns it had
    (a revision may add columns and tables, never drop a row)."""
    assert set(before) <= set(after), f"tables lost: {set(before) - set(after)}"
    for table, rows in before.items():
        assert len(after[table]) == len(rows), f"{table}: {len(rows)} rows before, {len(after[table])} after"
        kept = [tuple(kv for kv in row if kv[0] in dict(rows[0])) for row in after[table]] if rows else []
        assert sorted(kept, key=repr) == rows, f"{table}: rows changed"


# --- the head and the models -----------------------------------------------------------------------
def test_a_new_ledger_is_at_the_head_and_equals_the_models(tmp_path):
    ledger = Ledger(_sqlite(tmp_path))
    status = migrate.status(ledger.engine)
    assert status.up_to_date and status.current == migrate.head_revision()
    assert set(status.tables) == set(ledger_schema.metadata.tables)
    assert migrate.schema_diff(ledger.engine) == []


def test_a_model_change_without_a_revision_shows_as_a_difference(tmp_path):
    """What tests the test above: the comparison sees a new column, a new table and a new type."""
    ledger = Ledger(_sqlite(tmp_path))
    changed = MetaData()
    for table in ledger_schema.metadata.tables.values():
        table.to_metadata(changed)
    changed.tables["runs"].append_column(Column("priority", Integer))
    Table("run_labels", changed, Column("run_id", String(250), primary_key=True))
    changed.tables["checkpoints"].c.step.type = Float()
    kinds = {d[0] if isinstance(d, tuple) else d[0][0] for d in migrate.schema_diff(ledger.engine, changed)}
    assert {"add_column", "add_table", "modify_type"} <= kinds


def test_the_migrations_form_one_chain_from_the_baseline():
    chain = migrate.revisions()
    assert chain[-1] == migrate.head_revision()
    script = migrate.script_directory()
    assert script.get_revision(chain[0]).down_revision is None
    for older, newer in zip(chain, chain[1:], strict=False):
        assert script.get_revision(newer).down_revision == older


# --- upgrades keep every row -------------------------------------------------------------------
@pytest.mark.parametrize("revision", migrate.revisions())
def test_upgrading_from_each_revision_to_the_head_keeps_every_row(tmp_path, revision):
    engine = create_engine(_sqlite(tmp_path))
    migrate.upgrade(engine, revision)
    _fill(engine)
    before = _snapshot(engine)
    assert sum(map(len, before.values())) >= 3 * len(before) > 0
    migrate.upgrade(engine)
    assert migrate.status(engine).up_to_date
    _rows_kept(before, _snapshot(engine))
    assert migrate.schema_diff(engine) == []


def test_a_revision_failing_half_way_on_sqlite_leaves_nothing_and_a_rerun_upgrades(tmp_path, monkeypatch):
    """SQLite's driver commits DDL outside the transaction it opens itself: a revision killed
    after its first table used to keep that table, and every later upgrade failed on it."""
    from alembic.operations import Operations

    engine = create_engine(f"sqlite:///{tmp_path}/ledger.db")
    two_tables = "f9a2c7fec1e4"  # queue entries and reservation leases: a revision that creates two tables
    first = migrate.revisions()[migrate.revisions().index(two_tables) - 1]
    migrate.upgrade(engine, first)
    create_table = Operations.create_table
    created: list[str] = []

    def dies_after_its_first_table(self, name, *columns, **kw):
        if created:
            raise OSError("killed while migrating")
        created.append(name)
        return create_table(self, name, *columns, **kw)

    monkeypatch.setattr(Operations, "create_table", dies_after_its_first_table)
    with pytest.raises(OSError, match="killed"):
        migrate.upgrade(engine)
    monkeypatch.setattr(Operations, "create_table", create_table)
    with engine.connect() as c:
        assert migrate.current_revision(c) == first
        assert created and created[0] not in inspect(c).get_table_names()  # rolled back with it
    assert migrate.upgrade(engine) == (first, migrate.head_revision())


def test_a_ledger_written_without_migrations_is_adopted_with_its_rows(tmp_path):
    path = tmp_path / "ledger.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(PRE_MIGRATIONS_DUMP.read_text())
    engine = create_engine(f"sqlite:///{path}")
    before = _snapshot(engine)
    assert sum(map(len, before.values())) == 31 and "alembic_version" not in inspect(engine).get_table_names()

    ledger = Ledger(f"sqlite:///{path}")  # what every SAILOR process does when it opens the ledger
    assert migrate.status(ledger.engine).up_to_date
    _rows_kept(before, _snapshot(engine))
    assert migrate.schema_diff(ledger.engine) == []
    # the adopted rows read back through the API, and new rows go in beside them
    runs = {r["run_id"]: r for r in ledger.list_runs()}
    assert sorted(r["status"] for r in runs.values()) == ["failed", "running", "success"]
    assert [r.run_id for r in ledger.live_reservations()] == ["manual__2026-11-20T02:00:00+00:00"]
    assert ledger.latest_assignment().shares["research"]["europe-west4"] == 0.6
    ledger.reserve(Reservation("r-new", "us-east1", "us-east1-b", "T4", 1, "spot"))
    assert len(ledger.live_reservations()) == 2


def test_a_half_created_ledger_gets_its_missing_tables(tmp_path):
    """Tables and indexes of the baseline are created only where missing."""
    engine = create_engine(_sqlite(tmp_path))
    ledger_schema.runs.create(engine)
    with engine.begin() as conn:
        conn.execute(
            insert(ledger_schema.runs).values(
                run_id="r1", job_name="j", team="t", status="success", backend="local", model="m",
                dataset_uri="d", request={}, created_at=dt.datetime.now(dt.UTC),
                updated_at=dt.datetime.now(dt.UTC),
            )
        )  # fmt: skip
    Ledger(_sqlite(tmp_path))
    assert migrate.schema_diff(engine) == []
    with engine.connect() as conn:
        assert conn.execute(text("SELECT run_id FROM runs")).scalars().all() == ["r1"]


# --- errors ----------------------------------------------------------------------------------------
def test_a_ledger_from_a_newer_sailor_is_refused_naming_both_revisions(tmp_path):
    engine = create_engine(_sqlite(tmp_path))
    migrate.upgrade(engine)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = 'f00dfeed0001'"))
    with pytest.raises(LedgerSchemaError) as err:
        Ledger(_sqlite(tmp_path))
    assert "'f00dfeed0001'" in str(err.value) and migrate.head_revision() in str(err.value)
    with engine.connect() as conn:  # nothing changed
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one() == "f00dfeed0001"


def test_an_unknown_target_revision_is_refused_listing_the_valid_ones(tmp_path):
    engine = create_engine(_sqlite(tmp_path))
    with pytest.raises(LedgerSchemaError) as err:
        migrate.upgrade(engine, "nope")
    assert "'nope'" in str(err.value) and migrate.head_revision() in str(err.value)
    assert inspect(engine).get_table_names() == []


# --- adding a revision (docs/ledger.md, "Changing the ledger schema") ------------------------------
def _copy_migrations(tmp_path: Path) -> Path:
    location = tmp_path / "migrations"
    shutil.copytree(migrate.MIGRATIONS, location, ignore=shutil.ignore_patterns("__pycache__"))
    return location


def _changed_models() -> MetaData:
    """The models plus what a change might add: a nullable column with a default, and a table."""
    changed = MetaData()
    for table in ledger_schema.metadata.tables.values():
        table.to_metadata(changed)
    changed.tables["runs"].append_column(Column("priority", Integer, nullable=True))
    Table(
        "run_labels",
        changed,
        Column("run_id", String(250), primary_key=True),
        Column("holder", String(100), nullable=False),
        Column("expires_at", DateTime(timezone=True), nullable=False),
        Column("renewed", Boolean, nullable=False),
    )
    return changed


def test_a_generated_revision_upgrades_a_ledger_with_rows_and_loses_none(tmp_path):
    location = _copy_migrations(tmp_path)
    old_head = migrate.head_revision(location)
    changed = _changed_models()
    path = migrate.new_revision(
        "add run_labels and runs.priority", script_location=location, target_metadata=changed
    )
    assert path.parent == location / "versions" and path.name.endswith("_add_run_labels_and_runs_priority.py")
    assert "run_labels" in path.read_text() and "priority" in path.read_text()
    script = migrate.script_directory(location)
    new_head = migrate.head_revision(location)
    assert new_head != old_head and script.get_revision(new_head).down_revision == old_head

    engine = create_engine(_sqlite(tmp_path))
    migrate.upgrade(engine, old_head, script_location=location)  # the schema before the change
    _fill(engine)
    before = _snapshot(engine)
    before_at, after_at = migrate.upgrade(engine, script_location=location, target_metadata=changed)
    assert (before_at, after_at) == (old_head, new_head)
    after = _snapshot(engine)
    _rows_kept(before, after)
    assert after["run_labels"] == [] and all(dict(r)["priority"] == "None" for r in after["runs"])
    assert migrate.schema_diff(engine, changed) == []


def test_no_revision_is_written_when_the_models_did_not_change(tmp_path):
    location = _copy_migrations(tmp_path)
    with pytest.raises(LedgerSchemaError, match="match the newest revision"):
        migrate.new_revision("nothing", script_location=location)
    assert sorted(p.name for p in (location / "versions").glob("*.py")) == sorted(
        p.name for p in (migrate.MIGRATIONS / "versions").glob("*.py")
    )


def test_two_revisions_after_the_same_one_are_named_with_the_fix(tmp_path):
    """Two schema changes written in parallel on branches: merged, they fork the chain."""
    location = _copy_migrations(tmp_path)
    first = migrate.new_revision("first", script_location=location, target_metadata=_changed_models())
    text_ = first.read_text().replace(migrate.head_revision(location), "abcdef012345")
    (location / "versions" / "2026_11_23_abcdef012345_second.py").write_text(text_)
    migrate._script.cache_clear()
    with pytest.raises(LedgerSchemaError) as err:
        migrate.head_revision(location)
    assert (
        "2 heads" in str(err.value) and "abcdef012345" in str(err.value) and "down_revision" in str(err.value)
    )


# --- concurrency ---------------------------------------------------------------------------------
def _open(url: str) -> str:
    ledger = Ledger(url)
    with ledger.engine.connect() as conn:
        return migrate.current_revision(conn) or ""


def test_ledgers_opening_a_new_ledger_at_once_all_get_the_head(tmp_path):
    url = _sqlite(tmp_path)
    with ThreadPoolExecutor(4) as pool:  # each its own Ledger, engine and connections
        got = list(pool.map(_open, [url] * 4))
    assert got == [migrate.head_revision()] * 4
    with create_engine(url).connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM alembic_version")).scalar_one() == 1


# --- PostgreSQL ----------------------------------------------------------------------------------
def test_postgresql_ledger_written_without_migrations_is_adopted_with_its_rows(postgres):
    url = postgres.create_database("ledger_adopt")
    engine = create_engine(url)
    # the tables of a ledger from before migrations (the frozen SQLite ledger's), as create_all made them
    old = re.findall(r'CREATE TABLE "?(\w+)"?', PRE_MIGRATIONS_DUMP.read_text())
    ledger_schema.metadata.create_all(engine, tables=[ledger_schema.metadata.tables[n] for n in old])
    _fill(engine)
    before = _snapshot(engine)
    ledger = Ledger(url)
    assert migrate.status(ledger.engine).up_to_date
    _rows_kept(before, _snapshot(engine))
    assert migrate.schema_diff(engine) == []
    ledger.dispose()
    engine.dispose()


def test_postgresql_ledgers_opening_a_new_ledger_at_once_all_get_the_head(postgres):
    url = postgres.create_database("ledger_race")
    with ThreadPoolExecutor(4) as pool:  # each its own Ledger, engine and connections
        got = list(pool.map(_open, [url] * 4))
    assert got == [migrate.head_revision()] * 4
    engine = create_engine(url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM alembic_version")).scalar_one() == 1
    assert migrate.schema_diff(engine) == []
    engine.dispose()


def test_a_ledger_made_by_create_all_from_the_models_is_adopted(tmp_path):
    """Every revision that creates a table tolerates finding it: a ledger made by ``create_all``
    from today's models, with no revision recorded, is upgraded to the head, not refused."""
    from sqlalchemy import create_engine

    from sailor_tasks.ledger import Ledger
    from sailor_tasks.ledger import schema as models

    url = f"sqlite:///{tmp_path}/l.db"
    engine = create_engine(url)
    models.metadata.create_all(engine)
    engine.dispose()
    ledger = Ledger(url)
    assert ledger.latest_assignment() is None
    ledger.publish_assignment({"t": {"r": 1.0}}, source="night/1")
    assert ledger.latest_assignment().version == 1


def test_postgresql_records_a_replica_and_a_copy_lease_of_a_dataset_uri_as_long_as_a_request_allows(postgres):
    """The request schema allows a 1,024-character dataset_uri: its replica row and its copy's
    lease ("replica:" + the replica's URI) are stored, where VARCHAR(500) refused them once the
    copy was done."""
    ledger = Ledger(postgres.create_database("long_uris"))
    uri = "gs://my-data/" + "/".join(f"partition-{i:03d}" for i in range(70)) + "/shards"
    assert 900 < len(uri) <= 1024
    ledger.record_replica(uri, "us-central1", "gs://acme-sailor-us-central1/datasets/x", 1, 1)
    assert ledger.replicas([uri]) == {uri: ("us-central1",)}
    assert ledger.try_lease(f"replica:gs://acme-sailor-us-central1/{uri}", "copier", 60.0)
    ledger.dispose()
