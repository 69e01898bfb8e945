"""The SAILOR plugin: registered with Airflow, routes guarded by the login, HTML escaped."""

from __future__ import annotations

import math

import pytest

from sailor_tasks.stages.dashboard import RegionRow, Snapshot


@pytest.fixture(scope="module")
def plugin():
    import importlib.util
    import os

    path = os.path.join(os.environ["AIRFLOW__CORE__PLUGINS_FOLDER"], "sailor_ui.py")
    spec = importlib.util.spec_from_file_location("sailor_ui_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _snap(**kw):
    base = dict(
        regions=(RegionRow("us-central1", 100, 25, {"T4": 60, "L4": 40}),),
        reservations=(),
        assignment=None,
        placements=(),
        preemptions=(),
        runs=(),
        report_uri=None,
    )
    return Snapshot(**{**base, **kw})


def test_plugin_mounts_an_app_and_a_nav_view(plugin):
    p = plugin.SailorPlugin
    assert p.fastapi_apps[0]["url_prefix"] == "/sailor" and p.fastapi_apps[0]["app"] is plugin.app
    assert p.external_views[0]["href"] == "/sailor/" and p.external_views[0]["destination"] == "nav"


DOC_PATHS = ("/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json")
"""FastAPI's built-in documentation routes: added outside the app's dependencies, so they are
served to anyone unless the app turns them off or guards them itself."""


def _every_path(app) -> list[str]:
    return sorted({r.path for r in app.routes if hasattr(r, "methods")} | set(DOC_PATHS))


@pytest.fixture(scope="module")
def auth_manager():
    """The configured auth manager, created as the API server does before it mounts plugin apps."""
    from airflow.api_fastapi.app import create_auth_manager

    return create_auth_manager()


@pytest.fixture
def client(plugin, auth_manager):
    from fastapi.testclient import TestClient

    with TestClient(plugin.app) as c:
        yield c


@pytest.fixture
def token(auth_manager):
    """A valid Airflow login (a JWT signed by the configured auth manager)."""
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    return auth_manager.generate_jwt(SimpleAuthManagerUser(username="admin", role="admin"))


@pytest.mark.parametrize(
    ("headers", "cookies", "refused_with"),
    [
        ({}, {}, 401),
        ({"Authorization": "Bearer not-a-jwt"}, {}, 403),
        ({}, {"_token": "not-a-jwt"}, 403),
    ],
    ids=["no-token", "bad-bearer", "bad-cookie"],
)
def test_every_route_and_the_api_docs_refuse_callers_without_a_valid_login(
    plugin, client, headers, cookies, refused_with
):
    # Plugin apps inherit no auth from Airflow: the app must refuse every route itself, including
    # FastAPI's /docs, /redoc and /openapi.json (which describe every route to whoever asks).
    routes = {r.path for r in plugin.app.routes if hasattr(r, "methods")}
    assert {"/", "/api/snapshot", "/report.png"} <= routes
    served = []
    for path in _every_path(plugin.app):
        client.cookies.clear()
        client.cookies.update(cookies)
        resp = client.get(path, headers=headers, follow_redirects=False)
        # a route of the app is refused by the login; a documentation route may also not exist at all
        refused = resp.status_code == refused_with or (path not in routes and resp.status_code == 404)
        leaks = "SAILOR" in resp.text or "openapi" in resp.text.lower()
        if not refused or leaks:
            served.append(f"{path}: {resp.status_code} {resp.text.strip()[:60]!r}")
    assert not served, "served without a valid login:\n" + "\n".join(served)


def test_a_valid_login_reaches_every_app_route(plugin, client, token, monkeypatch):
    import sailor_tasks.stages.dashboard as dashboard

    monkeypatch.setattr(plugin, "_snapshot", lambda: _snap())
    monkeypatch.setattr(dashboard, "report_uri", lambda: None)
    auth = {"Authorization": f"Bearer {token}"}
    page = client.get("/", headers=auth)
    assert page.status_code == 200 and 'id="regions"' in page.text
    snap = client.get("/api/snapshot", headers=auth)
    assert snap.status_code == 200 and snap.json()["regions"][0]["region"] == "us-central1"
    report = client.get("/report.png", headers=auth)
    assert report.status_code == 404 and report.json() == {"detail": "no report yet"}
    client.cookies.set("_token", token)  # the UI's cookie login works too
    assert client.get("/").status_code == 200


def test_page_shows_regions_with_ratio_and_says_no_report_yet(plugin):
    html = plugin.render_page(_snap())
    assert 'id="regions"' in html and "us-central1" in html and "0.25" in html
    assert "No report yet" in html and "No placements yet" in html and "No assignment published yet" in html


def test_gpus_held_in_a_region_with_no_supply_show_as_over_not_balanced(plugin, client, token, monkeypatch):
    """A region gone from the supply (or the catalog) where runs still hold GPUs is the most
    overloaded, not an idle 0.00: the page says "no supply" with the over bar, the JSON null."""
    import sailor_tasks.stages.dashboard as dashboard

    gone = RegionRow("us-east4", 0, 8, {})
    assert gone.ratio == math.inf and RegionRow("us-east4", 0, 0, {}).ratio == 0.0
    snap = _snap(regions=(RegionRow("us-central1", 100, 25, {"T4": 100}), gone))
    html = plugin.render_page(snap)
    row = html[html.index("us-east4") :]
    assert "no supply" in row[:400] and 'class="fill over"' in row[:400]
    monkeypatch.setattr(plugin, "_snapshot", lambda: snap)
    monkeypatch.setattr(dashboard, "report_uri", lambda: None)
    regions = client.get("/api/snapshot", headers={"Authorization": f"Bearer {token}"}).json()["regions"]
    assert [r["ratio"] for r in regions] == [0.25, None]


def test_page_escapes_ledger_text(plugin):
    evil = "<script>alert(1)</script>"
    placement = {
        "created_at": None,
        "run_id": evil,
        "attempt": 1,
        "region": "r",
        "zone": "z",
        "num_gpus": 1,
        "gpu_type": "T4",
        "market": "spot",
        "usd_per_hour": 1.0,
        "assignment_version": None,
        "explanation": [evil],
    }
    html = plugin.render_page(_snap(placements=(placement,), report_uri="sailor://x/report.png"))
    assert evil not in html and "&lt;script&gt;" in html
    assert 'src="report.png"' in html


def test_page_shows_the_queue_panel(plugin):
    html = plugin.render_page(_snap())
    assert 'id="queue"' not in html and "No run is waiting for capacity." in html
    waiting = {
        "position": 1,
        "run_id": "run-<b>",
        "team": "ml",
        "priority": "high",
        "gpus": 2,
        "gpu_type": "T4",
        "reason": "las: team ml holds 0 GPUs",
        "estimated_start_at": "2026-11-23T10:00:00+00:00",
        "latest_start_at": None,
        "waited_min": 3.5,
    }
    html = plugin.render_page(_snap(queue=(waiting,), queue_policy="edf"))
    assert 'id="queue"' in html and "run-&lt;b&gt;" in html and "las: team ml holds 0 GPUs" in html
    assert "Admission policy: <b>edf</b>" in html and "2026-11-23 10:00:00" in html
    assert "runs queued<b>1</b>" in html


def test_page_shows_dollars_and_minutes_as_plain_numbers(plugin):
    run = {
        "run_id": "r",
        "job_name": "j",
        "team": "t",
        "status": "success",
        "region": "us-central1",
        "gpu_type": "A100",
        "steps": 300,
        "final_loss": 1.234,
        "usd_estimate": 12345.678,
    }
    waiting = {
        "position": 1,
        "run_id": "q",
        "team": "t",
        "priority": "normal",
        "gpus": 8,
        "gpu_type": "A100",
        "reason": "r",
        "estimated_start_at": None,
        "latest_start_at": None,
        "waited_min": 10080.0,
    }
    html = plugin.render_page(_snap(runs=(run,), queue=(waiting,)))
    assert "<td>12,345.68</td>" in html and "<td>10,080.0</td>" in html and "e+04" not in html


def test_a_nan_loss_and_a_report_file_that_is_gone_are_answered_not_500(plugin, client, token, monkeypatch, tmp_path):
    """A diverged run's loss is NaN in the ledger (PostgreSQL keeps it): the snapshot shows null.
    A report whose file was cleaned up is a 404 naming it."""
    import math

    import sailor_tasks.stages.dashboard as dashboard

    run = {"run_id": "r-1", "status": "failed", "final_loss": float("nan"), "initial_loss": math.inf}
    monkeypatch.setattr(plugin, "_snapshot", lambda: _snap(runs=(run,)))
    gone = f"file://{tmp_path}/report-gone.png"
    monkeypatch.setattr(dashboard, "report_uri", lambda: gone)
    auth = {"Authorization": f"Bearer {token}"}
    snap = client.get("/api/snapshot", headers=auth)
    assert snap.status_code == 200
    assert snap.json()["runs"] == [{"run_id": "r-1", "status": "failed", "final_loss": None, "initial_loss": None}]
    report = client.get("/report.png", headers=auth)
    assert report.status_code == 404 and gone in report.json()["detail"]


def test_the_report_is_read_with_the_connection_credentials_and_a_refusal_is_named(
    client, token, monkeypatch
):
    """On GKE the chart is in a bucket: it is read with the Airflow connection's credentials, as
    every stage reads, and a refusal is a 502 naming the file, not a bare 500."""
    import sailor_tasks.stages.dashboard as dashboard
    from sailor_tasks import gcp_auth

    uri = "gs://corp-sailor/reports/ratio.png"
    seen = []

    def denied(u):
        seen.append(gcp_auth.has_provider())
        raise PermissionError(f"403 Forbidden: {u}")

    monkeypatch.setattr(dashboard, "report_uri", lambda: uri)
    monkeypatch.setattr(dashboard, "read_report", denied)
    try:
        report = client.get("/report.png", headers={"Authorization": f"Bearer {token}"})
    finally:
        gcp_auth.set_provider(None)
    assert seen == [True]  # the connection's credentials were in place when it was read
    assert report.status_code == 502 and uri in report.json()["detail"] and "403" in report.json()["detail"]


def test_a_ledger_at_an_unknown_revision_is_a_503_naming_the_revision(client, token, monkeypatch, tmp_path):
    """A ledger a newer SAILOR upgraded: every route answers 503 saying why, not a bare 500."""
    from sqlalchemy import create_engine, text

    from sailor_tasks.ledger import Ledger

    url = f"sqlite:///{tmp_path}/ledger.db"
    Ledger(url).dispose()
    engine = create_engine(url)
    with engine.begin() as c:
        c.execute(text("UPDATE alembic_version SET version_num = 'ffffffffffff'"))
    engine.dispose()
    monkeypatch.setenv("SAILOR_LEDGER_URL", url)
    auth = {"Authorization": f"Bearer {token}"}
    for path in ("/", "/api/snapshot", "/report.png"):
        resp = client.get(path, headers=auth)
        assert resp.status_code == 503, (path, resp.status_code, resp.text[:200])
        detail = resp.json()["detail"]
        assert f"the SAILOR ledger {url} cannot be read: LedgerSchemaError" in detail
        assert "'ffffffffffff'" in detail


def test_an_unreachable_ledger_is_a_503_naming_it_without_its_password(client, token, monkeypatch):
    """Every route reads the ledger: one that cannot be reached (its server down) is answered 503
    with the URL (password hidden) and the reason, not a bare Internal Server Error."""
    monkeypatch.setenv("SAILOR_LEDGER_URL", "postgresql+psycopg2://sailor:s3cret@127.0.0.1:9/ledger")
    auth = {"Authorization": f"Bearer {token}"}
    for path in ("/", "/api/snapshot", "/report.png"):
        resp = client.get(path, headers=auth)
        assert resp.status_code == 503, (path, resp.status_code, resp.text[:200])
        detail = resp.json()["detail"]
        assert "postgresql+psycopg2://sailor:***@127.0.0.1:9/ledger cannot be reached" in detail
        assert "s3cret" not in detail and "OperationalError" in detail
