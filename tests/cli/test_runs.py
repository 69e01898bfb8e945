"""``sailor runs``: the ledger's runs, newest first, filtered by team and status."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from sailor_tasks.cli.main import main as sailor
from sailor_tasks.ledger import Ledger
from sailor_tasks.model import RUN_STATUSES

ROOT = Path(__file__).resolve().parents[2]


def _record(ledger: Ledger, run_id: str, team: str, status: str) -> None:
    ledger.upsert_run(
        run_id,
        job_name=f"job-{run_id}",
        team=team,
        status=status,
        backend="local",
        model="tiny_gpt",
        dataset_uri="sailor://source/datasets/demo",
        request={},
    )


def _listed(capsys, *args: str) -> list[str]:
    capsys.readouterr()
    assert sailor(["runs", "--json", *args]) == 0
    return [r["run_id"] for r in json.loads(capsys.readouterr().out)]


def test_runs_filters_by_team_and_status(settings, capsys):
    ledger = Ledger(settings.ledger_url)
    for run_id, team, status in [
        ("r1", "vision", "success"),
        ("r2", "vision", "failed"),
        ("r3", "nlp", "success"),
        ("r4", "nlp", "running"),
        ("r5", "vision", "running"),
    ]:
        _record(ledger, run_id, team, status)

    assert sorted(_listed(capsys)) == ["r1", "r2", "r3", "r4", "r5"]
    assert sorted(_listed(capsys, "--team", "vision")) == ["r1", "r2", "r5"]
    assert sorted(_listed(capsys, "--status", "running")) == ["r4", "r5"]
    assert sorted(_listed(capsys, "--team", "nlp", "--status", "success")) == ["r3"]
    assert sorted(_listed(capsys, "--status", "success,failed", "--team", "vision")) == ["r1", "r2"]
    assert sorted(_listed(capsys, "--status", "failed", "--status", "running")) == ["r2", "r4", "r5"]
    assert _listed(capsys, "--team", "nobody") == []

    assert sailor(["runs", "--team", "vision", "--status", "running"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["run_id", "job_name", "team"] and len(table) == 2
    assert table[1].split()[:3] == ["r5", "job-r5", "vision"]


def test_run_times_carry_their_utc_offset(settings, capsys):
    import datetime as dt

    ledger = Ledger(settings.ledger_url)
    _record(ledger, "r1", "vision", "success")
    assert ledger.get_run("r1")["created_at"].utcoffset() == dt.timedelta(0)
    assert ledger.list_runs()[0]["created_at"].utcoffset() == dt.timedelta(0)
    capsys.readouterr()
    assert sailor(["runs", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert dt.datetime.fromisoformat(row["created_at"]).utcoffset() == dt.timedelta(0)


def test_unknown_status_is_bad_input_naming_the_valid_ones(settings, capsys):
    assert sailor(["runs", "--status", "success,done"]) == 2
    err = capsys.readouterr().err
    assert "'done'" not in err and "done" in err and "valid: " + ", ".join(RUN_STATUSES) in err
    assert sailor(["runs", "--limit", "0"]) == 2
    assert "--limit 0" in capsys.readouterr().err


def test_every_status_the_stages_record_is_a_known_status():
    """RUN_STATUSES lists every status a stage writes, so --status offers each of them."""
    written = set()
    for path in (ROOT / "sailor_tasks" / "stages").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "upsert_run":
                for kw in node.keywords:
                    if kw.arg == "status" and isinstance(kw.value, ast.Constant):
                        written.add(kw.value.value)
    assert written and written <= set(RUN_STATUSES), written - set(RUN_STATUSES)


def test_a_diverged_loss_is_null_in_json_and_money_is_never_in_scientific_notation(
    settings, capsys, monkeypatch
):
    """A diverged run's loss is NaN in the ledger: ``--json`` stays strict JSON (null); the table
    shows $12,345.68, not 1.235e+04."""
    ledger = Ledger(settings.ledger_url)
    _record(ledger, "r-nan", "vision", "failed")
    ledger.upsert_run("r-nan", usd_estimate=12345.678)
    real = Ledger.list_runs

    def with_nan(self, *a, **k):
        return [{**r, "final_loss": float("nan")} for r in real(self, *a, **k)]

    monkeypatch.setattr(Ledger, "list_runs", with_nan)
    capsys.readouterr()
    assert sailor(["runs", "--json"]) == 0

    def refuse(token):
        raise ValueError(f"not JSON: {token}")

    (row,) = json.loads(capsys.readouterr().out, parse_constant=refuse)
    assert row["final_loss"] is None
    assert sailor(["runs"]) == 0
    table = capsys.readouterr().out
    assert "12,345.68" in table and "e+04" not in table


def test_table_times_are_shown_in_utc_and_marked_so():
    """The ledger's times are UTC: the table says so (``Z``), whatever zone the time came in."""
    import datetime as dt

    from sailor_tasks.cli.output import format_table

    kolkata = dt.timezone(dt.timedelta(hours=5, minutes=30))
    rows = [
        {"at": dt.datetime(2026, 11, 29, 20, 49, tzinfo=kolkata)},
        {"at": dt.datetime(2026, 11, 29, 15, 19)},
    ]
    assert format_table(rows, ["at"])[1:] == ["2026-11-29 15:19Z", "2026-11-29 15:19"]
