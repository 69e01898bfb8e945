"""The SAILOR plugin: registered with Airflow, routes guarded by the login, HTML escaped."""

from __future__ import annotations

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


def test_every_route_requires_the_airflow_login(plugin):
    # The app-level dependency applies to every route (plugin apps inherit no auth from Airflow).
    deps = [d.dependency.__qualname__ for d in plugin.app.router.dependencies]
    assert any("requires_access_view" in q for q in deps), deps
    paths = {r.path for r in plugin.app.routes if hasattr(r, "methods")}
    assert {"/", "/api/snapshot", "/report.png"} <= paths


def test_page_shows_regions_with_ratio_and_says_no_report_yet(plugin):
    html = plugin.render_page(_snap())
    assert 'id="regions"' in html and "us-central1" in html and "0.25" in html
    assert "No report yet" in html and "No placements yet" in html and "No assignment published yet" in html


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
