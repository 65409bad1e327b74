"""RunPod's network volumes (REST v1 ``/networkvolumes``), every request and response checked
against the published OpenAPI document by :class:`~tests.fakes.base.FakeControlPlane`.

As RunPod documents them: ``POST`` takes ``{name, size, dataCenterId}`` and answers 200 with the
``NetworkVolume``; names need not be unique (a second create with the same name makes a second
volume, and a second bill); ``DELETE`` answers 204, and 404 for a volume that does not exist.
"""

from __future__ import annotations

import secrets
from typing import Any

from .base import FakeControlPlane


class RunPodVolumesFake(FakeControlPlane):
    contract = "runpod-rest-v1.openapi.json"
    server_url = "https://rest.runpod.io/v1"

    def __init__(self, work_root, account_key: str | None = None) -> None:
        super().__init__(None, work_root, account_key)
        self.volumes: dict[str, dict[str, Any]] = {}

    def route(self, method: str, path: str, body: Any, query: dict, auth: str) -> tuple[int, Any]:
        if auth != self.account_key:
            return 401, {"error": "Unauthorized"}
        if path == "/networkvolumes" and method == "GET":
            return 200, list(self.volumes.values())
        if path == "/networkvolumes" and method == "POST":
            vid = secrets.token_hex(5)
            self.volumes[vid] = {"id": vid, "name": body["name"], "size": body["size"],
                                 "dataCenterId": body["dataCenterId"]}
            return 200, dict(self.volumes[vid])
        if path.startswith("/networkvolumes/") and method == "DELETE":
            vid = path.rsplit("/", 1)[1]
            if self.volumes.pop(vid, None) is None:
                return 404, {"error": "network volume not found", "_undocumented": True}
            return 204, None
        return 404, {"error": f"no route {method} {path}", "_undocumented": True}
