"""The SAILOR page in the Airflow UI: a read-only view of regions, reservations, placements and preemptions.

An Airflow 3 plugin: a FastAPI app mounted by the API server at ``/sailor`` and an external view
that shows it in the UI's navigation (a "SAILOR" entry, at ``/plugin/sailor``). Plugin apps are not
authenticated by Airflow (they are mounted, and inherit none of the core API's dependencies), so the
app requires the caller's Airflow login itself: every route depends on ``requires_access_view``,
which reads the JWT from the ``Authorization`` header or the UI's ``_token`` cookie and asks the
auth manager. FastAPI's own ``/docs``, ``/redoc`` and ``/openapi.json`` would bypass that
dependency, so they are turned off. The data comes from ``sailor_tasks.stages.dashboard``; this
module only renders it.
"""

from __future__ import annotations

import html
import json
import math
from typing import Any

from airflow.api_fastapi.auth.managers.models.resource_details import AccessView
from airflow.api_fastapi.core_api.security import requires_access_view
from airflow.plugins_manager import AirflowPlugin
from fastapi import Depends, FastAPI
from fastapi.responses import HTMLResponse, JSONResponse, Response

URL_PREFIX = "/sailor"

app = FastAPI(
    title="SAILOR",
    description="Read-only views over SAILOR's ledger and catalog.",
    dependencies=[Depends(requires_access_view(AccessView.PLUGINS))],
    # FastAPI adds /docs, /redoc and /openapi.json outside the app's dependencies: they would be
    # served to anyone without a login, so the app has none.
    docs_url=None,
    redoc_url=None,
    openapi_url=None,
)


def _snapshot():
    from sailor_tasks.stages.dashboard import snapshot

    return snapshot()


def _unavailable() -> tuple[type[Exception], ...]:
    """What makes the page's data unreadable (``_ledger_down`` answers each): the ledger down or at
    a revision this SAILOR does not know, or the catalog unloadable."""
    from sqlalchemy.exc import DBAPIError

    from sailor_tasks.errors import CatalogError, LedgerSchemaError

    return DBAPIError, LedgerSchemaError, CatalogError


def _ledger_down(exc: Exception) -> JSONResponse:
    """503 naming what cannot be read, the ledger (its password hidden) or the catalog, and why."""
    from sailor_tasks.errors import CatalogError, LedgerSchemaError
    from sailor_tasks.settings import Settings

    reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0][:300]
    if isinstance(exc, CatalogError):
        what = "the SAILOR catalog cannot be loaded"
    else:
        where = Settings.from_env().ledger_url_redacted
        how = "cannot be read" if isinstance(exc, LedgerSchemaError) else "cannot be reached"
        what = f"the SAILOR ledger {where} {how}"
    return JSONResponse({"detail": f"{what}: {type(exc).__name__}: {reason}"}, status_code=503)


def _e(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return html.escape(f"{value:.4g}")
    if hasattr(value, "isoformat"):
        return html.escape(value.isoformat(timespec="seconds"))
    return html.escape(str(value))


def _fixed(value: Any, fmt: str) -> str:
    """A number with a fixed format (money, minutes): '.4g' would show $12,345.67 as 1.235e+04."""
    return "–" if value is None else html.escape(format(value, fmt))


def _table(headers: list[str], rows: list[list[str]], empty: str, table_id: str) -> str:
    if not rows:
        return f'<p class="empty" id="{table_id}-empty">{html.escape(empty)}</p>'
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _bar(ratio: float) -> str:
    width = max(0.0, min(ratio, 1.0)) * 100
    cls = "over" if ratio > 1.0 else "ok"
    return f'<div class="bar"><div class="fill {cls}" style="width:{width:.0f}%"></div></div>'


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:16px 24px;color:#1f2933}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:24px 0 8px;border-bottom:1px solid #e4e7eb}
.sub{color:#616e7c;font-size:13px} .cards{display:flex;gap:12px;margin:12px 0}
.card{border:1px solid #e4e7eb;border-radius:8px;padding:8px 14px;min-width:130px}
.card b{display:block;font-size:20px} table{border-collapse:collapse;font-size:13px;width:100%}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #f0f2f4;vertical-align:top}
th{background:#f5f7fa} .bar{width:120px;height:10px;background:#eef2f7;border-radius:5px}
.fill{height:10px;border-radius:5px} .fill.ok{background:#3e9b6a} .fill.over{background:#d64545}
.empty{color:#616e7c;font-style:italic} ul.why{margin:0;padding-left:16px} img{max-width:100%}
code{font-size:12px}
"""


def render_page(snap) -> str:
    """HTML of the SAILOR page for a ``dashboard.Snapshot``."""
    regions = [
        [
            f"<b>{_e(r.region)}</b>",
            _e(r.supply_gpus),
            _e(r.reserved_gpus),
            f"{r.ratio:.2f} {_bar(r.ratio)}" if math.isfinite(r.ratio) else f"no supply {_bar(r.ratio)}",
            _e(r.assignment_load),
            _e(", ".join(f"{g} {n}" for g, n in r.gpus_by_type.items())),
        ]
        for r in snap.regions
    ]
    reservations = [
        [
            f"<code>{_e(r['run_id'])}</code>",
            _e(r["region"]),
            _e(r["zone"]),
            _e(r["gpu_type"]),
            _e(r["gpus"]),
            _e(r["market"]),
            _e(str(r.get("lease_expires_at") or "")[:19].replace("T", " ")),
        ]
        for r in snap.reservations
    ]
    queue = [
        [
            _e(q["position"]),
            f"<code>{_e(q['run_id'])}</code>",
            _e(q["team"]),
            _e(q["priority"]),
            f"{_e(q['gpus'])}× {_e(q['gpu_type'])}",
            _fixed(q["waited_min"], ",.1f"),
            _e(str(q["estimated_start_at"] or "")[:19].replace("T", " ")),
            _e(str(q["latest_start_at"] or "")[:19].replace("T", " ")),
            _e(q["reason"]),
        ]
        for q in snap.queue
    ]
    placements = [
        [
            _e(p["created_at"]),
            f"<code>{_e(p['run_id'])}</code>",
            _e(p["attempt"]),
            f"{_e(p['region'])} / {_e(p['zone'])}",
            f"{_e(p['num_gpus'])}× {_e(p['gpu_type'])} {_e(p['market'])}",
            f"${p['usd_per_hour']:.2f}/h",
            _e(p["assignment_version"]),
            '<ul class="why">' + "".join(f"<li>{_e(line)}</li>" for line in p["explanation"]) + "</ul>",
        ]
        for p in snap.placements
    ]
    preemptions = [
        [
            _e(p["at"]),
            f"<code>{_e(p['run_id'])}</code>",
            _e(p["attempt"]),
            f"{_e(p['region'])} / {_e(p['zone'])}",
            "yes" if p["noticed"] else "no",
            _e(p["step"]),
            _e(p["steps_lost"]),
            "recovered in " + _e(p["recovery_s"]) + " s" if p["recovery_s"] is not None else "not recovered",
        ]
        for p in snap.preemptions
    ]
    runs = [
        [
            f"<code>{_e(r['run_id'])}</code>",
            _e(r["job_name"]),
            _e(r["team"]),
            f"<b>{_e(r['status'])}</b>",
            _e(r["region"]),
            _e(r["gpu_type"]),
            _e(r["steps"]),
            _e(r["final_loss"]),
            _fixed(r["usd_estimate"], ",.2f"),
        ]
        for r in snap.runs
    ]
    a = snap.assignment
    if a:
        shares = "".join(
            f"<li><b>{_e(team)}</b>: "
            + _e(", ".join(f"{reg} {s:.0%}" for reg, s in sorted(s.items(), key=lambda kv: -kv[1])[:4]))
            + "</li>"
            for team, s in sorted(a["shares"].items())
        )
        assignment = (
            f'<p id="assignment">Version <b>v{_e(a["version"])}</b>, published {_e(str(a["created_at"])[:19].replace("T", " "))} UTC '
            f"by {_e(a['source'])}</p><ul>{shares}</ul>"
        )
    else:
        assignment = (
            '<p class="empty" id="assignment">No assignment published yet (run sailor_rebalance).</p>'
        )
    report = (
        f'<img id="report" alt="last rebalance report" src="report.png"><p class="sub">{_e(snap.report_uri)}</p>'
        if snap.report_uri
        else '<p class="empty" id="report-empty">No report yet: sailor_rebalance has not recorded a chart.</p>'
    )
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>SAILOR</title>
<style>{_CSS}</style></head><body>
<h1>SAILOR</h1><div class="sub">Regions, capacity and where runs went · read-only · {_e(snap.taken_at)} UTC</div>
<div class="cards"><div class="card">regions<b>{len(snap.regions)}</b></div>
<div class="card">GPUs in supply<b>{snap.total_supply}</b></div>
<div class="card">GPUs reserved<b>{snap.total_reserved}</b></div>
<div class="card">runs queued<b>{len(queue)}</b></div>
<div class="card">assignment<b>{"v" + _e(a["version"]) if a else "–"}</b></div></div>
<h2>Regions</h2>
{_table(["region", "supply (GPUs)", "reserved (GPUs)", "demand / supply", "load at last rebalance", "supply by GPU type"], regions, "The catalog has no regions.", "regions")}
<h2>Queue</h2>
<div class="sub">Admission policy: <b>{_e(snap.queue_policy)}</b></div>
{_table(["position", "run", "team", "priority", "GPUs", "waited (min)", "estimated start", "latest start", "reason"], queue, "No run is waiting for capacity.", "queue")}
<h2>Live reservations</h2>
{_table(["run", "region", "zone", "GPU", "GPUs", "market", "lease expires"], reservations, "No live reservations.", "reservations")}
<h2>Current assignment</h2>
{assignment}
<h2>Recent placements</h2>
{_table(["at", "run", "attempt", "where", "what", "price", "assignment", "why"], placements, "No placements yet.", "placements")}
<h2>Recent preemptions and recoveries</h2>
{_table(["at", "run", "attempt", "where", "noticed", "step", "steps lost", "recovery"], preemptions, "No preemptions recorded.", "preemptions")}
<h2>Recent runs</h2>
{_table(["run", "job", "team", "status", "region", "GPU", "steps", "final loss", "est. USD"], runs, "No runs yet.", "runs")}
<h2>Last rebalance report</h2>
{report}
</body></html>"""


@app.get("/", response_class=HTMLResponse)
def page() -> HTMLResponse:
    """The SAILOR page (503 naming the ledger when it cannot be read)."""
    try:
        snap = _snapshot()
    except _unavailable() as exc:
        return _ledger_down(exc)
    return HTMLResponse(render_page(snap))


@app.get("/api/snapshot")
def snapshot_json() -> JSONResponse:
    """The page's data as JSON (NaN and infinities as null)."""
    import dataclasses

    from sailor_tasks.model import finite, json_default

    try:
        snap = _snapshot()
    except _unavailable() as exc:
        return _ledger_down(exc)
    data = dataclasses.asdict(snap)
    for row, region in zip(data["regions"], snap.regions, strict=True):
        row["ratio"] = region.ratio
    return JSONResponse(finite(json.loads(json.dumps(data, default=json_default))))


@app.get("/report.png")
def report_png() -> Response:
    """The last rebalance report chart, read with the Airflow connection's Google Cloud
    credentials (``gcp.install``, as every stage); 404 when no rebalance has recorded one or its
    file is gone (its bucket cleaned up), 502 naming it when it cannot be read (access denied),
    503 when the ledger cannot be reached."""
    from sailor_tasks.airflow_glue import gcp
    from sailor_tasks.stages.dashboard import read_report, report_uri

    try:
        uri = report_uri()
    except _unavailable() as exc:
        return _ledger_down(exc)
    if not uri:
        return JSONResponse({"detail": "no report yet"}, status_code=404)
    gcp.install()
    try:
        return Response(read_report(uri), media_type="image/png")
    except FileNotFoundError:
        return JSONResponse({"detail": f"the last report, {uri}, no longer exists"}, status_code=404)
    except Exception as exc:  # a store's refusal or a credentials error: the page shows why
        return JSONResponse(
            {"detail": f"the last report, {uri}, cannot be read: {type(exc).__name__}: {exc}"},
            status_code=502,
        )


class SailorPlugin(AirflowPlugin):
    name = "sailor"
    fastapi_apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "SAILOR"}]
    external_views = [
        {
            "name": "SAILOR",
            "href": f"{URL_PREFIX}/",
            "destination": "nav",
            "url_route": "sailor",
        }
    ]
