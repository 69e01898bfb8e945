"""A local HTTP server answering the Google API calls ``sailor check`` makes, as Google documents
them: Compute Engine ``regions.get`` (v1 REST), Artifact Registry ``packages.tags.get`` and
``dockerImages.get``, Service Usage ``services.get``, IAM ``projects.serviceAccounts.getIamPolicy``
(POST). Requests to any other path get a 404 and are kept in ``unexpected``, so a test sees a
client library building a wrong URL."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit


@dataclass
class GoogleState:
    quotas: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)
    """(project, region) → metric → limit."""
    images: set[str] = field(default_factory=set)
    """``projects/P/locations/L/repositories/R/packages/IMAGE/tags/TAG`` resource names that exist."""
    services: dict[tuple[str, str], str] = field(default_factory=dict)
    """(project, service) → ENABLED | DISABLED."""
    service_accounts: dict[str, list[dict]] = field(default_factory=dict)
    """Google service account email → the bindings of its IAM policy (``{"role", "members"}``)."""
    forbidden_projects: set[str] = field(default_factory=set)
    requests: list[str] = field(default_factory=list)
    """Every request's path (a POST's prefixed ``POST ``, with its query string)."""
    unexpected: list[str] = field(default_factory=list)


ROUTES = {
    "region": re.compile(
        r"^/compute/v1/projects/(?P<project>[a-z][-a-z0-9]*)/regions/(?P<region>[a-z0-9-]+)$"
    ),
    "tag": re.compile(
        r"^/v1/(?P<name>projects/(?P<project>[^/]+)/locations/[^/]+/repositories/[^/]+/packages/[^/]+/tags/[^/]+)$"
    ),
    "service": re.compile(
        r"^/v1/projects/(?P<project>[^/]+)/services/(?P<service>[a-z.]+\.googleapis\.com)$"
    ),
}
POLICY = re.compile(
    r"^/v1/projects/-/serviceAccounts/(?P<email>[^/@]+@(?P<project>[^./]+)\.iam\.gserviceaccount\.com)"
    r":getIamPolicy$"
)


def _handler(state: GoogleState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _send(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, message: str) -> None:
            reason = {403: "PERMISSION_DENIED", 404: "NOT_FOUND"}.get(status, "UNKNOWN")
            self._send(status, {"error": {"code": status, "message": message, "status": reason}})

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            path = urlsplit(self.path).path
            state.requests.append(path)
            found = next(((r, m) for r, p in ROUTES.items() if (m := p.match(path))), None)
            if found is None:
                state.unexpected.append(path)
                return self._error(404, f"no such API path: {path}")
            route, m = found
            if m["project"] in state.forbidden_projects:
                return self._error(403, f"Permission denied on project {m['project']}")
            if route == "region":
                quotas = state.quotas.get((m["project"], m["region"]))
                if quotas is None:
                    return self._error(
                        404, f"The resource 'projects/{m['project']}/regions/{m['region']}' was not found"
                    )
                body = {
                    "kind": "compute#region",
                    "name": m["region"],
                    "status": "UP",
                    "quotas": [{"metric": k, "limit": float(v), "usage": 0.0} for k, v in quotas.items()],
                }
                return self._send(200, body)
            if route == "tag":
                name = unquote(m["name"])
                if name not in state.images:
                    return self._error(404, f"Requested entity was not found: {name}")
                return self._send(
                    200, {"name": name, "version": f"{name.rsplit('/tags/', 1)[0]}/versions/sha256:00"}
                )
            svc = state.services.get((m["project"], m["service"]), "DISABLED")
            return self._send(200, {"name": f"projects/{m['project']}/services/{m['service']}", "state": svc})

        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            url = urlsplit(self.path)
            state.requests.append(f"POST {url.path}?{url.query}")
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            m = POLICY.match(unquote(url.path))
            if m is None:
                state.unexpected.append(f"POST {url.path}")
                return self._error(404, f"no such API path: {url.path}")
            if m["project"] in state.forbidden_projects:
                return self._error(
                    403, f"Permission 'iam.serviceAccounts.getIamPolicy' denied on {m['email']}"
                )
            bindings = state.service_accounts.get(m["email"])
            if bindings is None:
                return self._error(404, f"Service account projects/-/serviceAccounts/{m['email']} not found")
            return self._send(200, {"version": 1, "etag": "BwYAAAAAAAA=", "bindings": bindings})

    return Handler


@contextmanager
def google_apis(state: GoogleState) -> Iterator[str]:
    """Serve ``state`` on 127.0.0.1 and a free port; yields the endpoint (``http://127.0.0.1:PORT``)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
