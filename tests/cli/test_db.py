"""``sailor db``: current shows the revision without changing the ledger, upgrade brings it to the
head (and is a no-op there), bad revisions are bad input naming the valid ones."""

from __future__ import annotations

import json
import os

from sqlalchemy import create_engine, inspect

from sailor_tasks.cli.main import main as sailor
from sailor_tasks.ledger import migrate


def test_current_then_upgrade_then_current(settings, capsys):
    assert sailor(["db", "current", "--json"]) == 0
    before = json.loads(capsys.readouterr().out)
    assert before["current"] is None and before["up_to_date"] is False and before["tables"] == []
    assert before["head"] == migrate.head_revision()

    assert sailor(["db", "upgrade"]) == 0
    assert f"upgraded from (none) to {migrate.head_revision()}" in capsys.readouterr().out
    assert sailor(["db", "upgrade"]) == 0
    assert "nothing to upgrade" in capsys.readouterr().out

    assert sailor(["db", "current"]) == 0
    out = capsys.readouterr().out
    assert f"revision: {migrate.head_revision()}" in out and "(up to date)" in out


def test_ledger_url_option_and_redacted_password(settings, tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'other.db'}"
    assert sailor(["db", "upgrade", "--ledger-url", url]) == 0
    assert "runs" in inspect(create_engine(url)).get_table_names()
    capsys.readouterr()
    unreachable = "postgresql+psycopg2://sailor:s3cret@127.0.0.1:1/none"
    assert sailor(["db", "current", "--ledger-url", unreachable]) == 3
    err = capsys.readouterr().err
    assert "cannot use the ledger at postgresql+psycopg2://sailor:***@127.0.0.1:1/none" in err
    assert "s3cret" not in err


def test_a_bad_ledger_url_option_is_bad_input_naming_the_option_not_the_environment(settings, capsys):
    for action in ("current", "upgrade"):
        assert sailor(["db", action, "--ledger-url", "notaurl"]) == 2
        err = capsys.readouterr().err
        assert "--ledger-url 'notaurl' is not a usable SQLAlchemy URL" in err
        assert "SAILOR_LEDGER_URL" not in err


def test_an_unknown_revision_is_bad_input_naming_the_valid_ones(settings, capsys):
    assert sailor(["db", "upgrade", "--revision", "nope"]) == 2
    err = capsys.readouterr().err
    assert "'nope'" in err and migrate.head_revision() in err
    assert not os.path.exists(settings.ledger_url.removeprefix("sqlite:///"))  # nothing made


def test_an_unknown_revision_makes_no_folder_for_the_ledger(settings, tmp_path, capsys):
    folder = tmp_path / "not-yet"
    assert (
        sailor(["db", "upgrade", "--revision", "nope", "--ledger-url", f"sqlite:///{folder}/ledger.db"]) == 2
    )
    assert "unknown ledger revision 'nope'" in capsys.readouterr().err
    assert not folder.exists()


def test_current_of_a_ledger_file_that_does_not_exist_creates_nothing(settings, tmp_path, capsys):
    path = tmp_path / "not-yet" / "ledger.db"
    assert sailor(["db", "current", "--ledger-url", f"sqlite:///{path}"]) == 0
    out = capsys.readouterr().out
    assert "(no such file yet)" in out and "revision: (none)" in out
    assert not path.exists() and not path.parent.exists()


def test_every_command_reports_an_unusable_ledger_or_setting_in_one_line(settings, monkeypatch, capsys):
    """No traceback: the value, what is wrong, and the exit status of its kind."""
    monkeypatch.setenv("SAILOR_LEDGER_URL", "postgresql+psycopg://sailor:s3cret@127.0.0.1:1/none")
    assert sailor(["runs"]) == 3
    err = capsys.readouterr().err
    assert err.startswith(
        "error: cannot use the ledger at postgresql+psycopg://sailor:***@127.0.0.1:1/none: "
    )
    assert "s3cret" not in err and "Traceback" not in err and len(err.splitlines()) == 1

    for url in ("notadb://x", "not a url"):
        monkeypatch.setenv("SAILOR_LEDGER_URL", url)
        assert sailor(["show", "run-1"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: SAILOR_LEDGER_URL={url!r} is not a usable SQLAlchemy URL")

    monkeypatch.delenv("SAILOR_LEDGER_URL")
    monkeypatch.setenv("SAILOR_LEASE_S", "soon")
    assert sailor(["queue"]) == 2
    assert capsys.readouterr().err == "error: SAILOR_LEASE_S='soon': need a number of seconds > 0\n"


def test_a_ledger_a_newer_sailor_migrated_or_without_its_driver_is_one_line_too(
    settings, tmp_path, monkeypatch, capsys
):
    """A ledger at a revision this SAILOR does not know, a URL whose database driver is not
    installed, and a bad --ledger-url that parses: bad input, named, no traceback."""
    from sqlalchemy import text

    url = f"sqlite:///{tmp_path}/newer.db"
    engine = create_engine(url)
    migrate.upgrade(engine)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = 'f00dfeed0001'"))
    monkeypatch.setenv("SAILOR_LEDGER_URL", url)
    for command in (["runs"], ["queue"]):
        assert sailor(command) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: cannot use the ledger at {url}: ") and "'f00dfeed0001'" in err
        assert len(err.splitlines()) == 1
    monkeypatch.setenv("SAILOR_LEDGER_URL", "mysql://u:pw@localhost/x")  # mysqlclient not installed
    assert sailor(["runs"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: SAILOR_LEDGER_URL='mysql://u:***@localhost/x': its database driver")
    assert sailor(["db", "current", "--ledger-url", "foo://bar"]) == 2
    assert capsys.readouterr().err.startswith(
        "error: --ledger-url 'foo://bar' is not a usable SQLAlchemy URL"
    )


def test_commands_that_only_read_neither_create_nor_upgrade_a_ledger(settings, tmp_path, monkeypatch, capsys):
    """A mistyped SAILOR_LEDGER_URL names a file that does not exist: `runs` and `queue` say so
    and list nothing, `show` finds no run, and no file or folder appears. A ledger behind this
    SAILOR's revision is refused (`sailor db upgrade` brings it up), not upgraded under the
    workers that use it."""
    typo = tmp_path / "typo" / "ledgr.db"
    monkeypatch.setenv("SAILOR_LEDGER_URL", f"sqlite:///{typo}")
    for command in (["runs"], ["queue"], ["runs", "--json"]):
        assert sailor(command) == 0
        assert f"no ledger at sqlite:///{typo} yet" in capsys.readouterr().err
    assert sailor(["show", "run-1"]) == 3
    assert "there is no ledger at" in capsys.readouterr().err
    assert not typo.parent.exists()

    old = tmp_path / "old.db"
    engine = create_engine(f"sqlite:///{old}")
    first = migrate.revisions()[0]
    migrate.upgrade(engine, first)
    monkeypatch.setenv("SAILOR_LEDGER_URL", f"sqlite:///{old}")
    for command in (["runs"], ["queue"], ["show", "run-1"]):
        assert sailor(command) == 2
        err = capsys.readouterr().err
        assert "behind this SAILOR's" in err and "sailor db upgrade" in err and len(err.splitlines()) == 1
    with engine.connect() as conn:
        assert migrate.current_revision(conn) == first  # unchanged
