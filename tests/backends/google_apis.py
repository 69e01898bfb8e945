"""A local HTTP server answering the Google API calls ``sailor check`` makes, as Google documents
them: Compute Engine ``regions.get`` (v1 REST), Artifact Registry ``packages.tags.get`` and
``dockerImages.get``, Service Usage ``services.get``. Requests to any other path get a 404 and are
kept in ``unexpected``, so a test sees a client library building a wrong URL."""

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
    forbidden_projects: set[str] = field(default_factory=set)
    requests: list[str] = field(default_factory=list)
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
