"""A stand-in for a container runtime: the Docker Engine API over a Unix socket.

Podman cannot start containers in the test sandbox and Docker is absent, so the owner lookup
is tested against this server. It answers ``GET /containers/{id}/json`` with the fields the
Docker Engine API reference documents for "Inspect a container" (``Id``, ``Name`` with its
leading ``/``, ``Config.Image``, ``Config.Labels``, ``State``) and ``404`` with
``{"message": "No such container: <id>"}`` for an unknown id, as dockerd and Podman's
compatible socket do. ``requests`` counts what was asked, so tests can check the cache.
"""

from __future__ import annotations

import json
import socketserver
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any


def inspect_body(cid: str, *, name: str, image: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A ``GET /containers/{id}/json`` response body as the Docker Engine API documents it."""
    return {
        "Id": cid,
        "Created": "2026-11-30T08:00:00.000000000Z",
        "Name": f"/{name}",
        "Image": "sha256:" + "ab" * 32,
        "State": {"Status": "running", "Running": True, "Pid": 41001},
        "Config": {"Image": image, "Labels": dict(labels or {}), "User": ""},
        "HostConfig": {"DeviceRequests": [{"Driver": "", "Count": 0, "DeviceIDs": ["GPU-0"], "Capabilities": [["gpu"]]}]},
    }


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    containers: dict[str, dict[str, Any]]
    requests: list[str]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Api-Version", "1.43")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self.server.requests.append(self.path)
        parts = self.path.split("?")[0].strip("/").split("/")
        if parts and parts[0].startswith("v1."):
            parts = parts[1:]  # versioned path: /v1.43/containers/{id}/json
        if len(parts) == 3 and parts[0] == "containers" and parts[2] == "json":
            body = self.server.containers.get(parts[1])
            if body is None:
                self._send(404, {"message": f"No such container: {parts[1]}"})
            else:
                self._send(200, body)
            return
        self._send(404, {"message": "page not found"})


class DockerStandIn:
    """Serve ``containers`` (id -> inspect body) on the Unix socket ``path`` until ``close()``."""

    def __init__(self, path: Path, containers: dict[str, dict[str, Any]] | None = None) -> None:
        self.path = Path(path)
        self.server = _Server(str(self.path), _Handler)
        self.server.containers = dict(containers or {})
        self.server.requests = []
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def containers(self) -> dict[str, dict[str, Any]]:
        return self.server.containers

    @property
    def requests(self) -> list[str]:
        return self.server.requests

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.path.unlink(missing_ok=True)
