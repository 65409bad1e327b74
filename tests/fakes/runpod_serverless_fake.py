"""RunPod Serverless (REST v1 ``/templates`` and ``/endpoints``), every request and response checked
against the published OpenAPI document by :class:`~tests.fakes.base.FakeControlPlane`.

As the document describes them: ``POST /templates`` (TemplateCreateInput) answers 200 with the
``Template``, whose name "needs to be unique" (a second template with the same name: 400);
``POST /endpoints`` (EndpointCreateInput, ``templateId`` required) answers 200 with the ``Endpoint``
(an unknown template: 400); ``GET /endpoints/{id}`` 200 or 404;
``GET /endpoints`` (ListEndpoints) the array of them; ``DELETE /endpoints/{id}`` and
``DELETE /templates/{id}`` answer 204, and 400 ("Invalid ... ID") for ids that do not exist, the
only failures those operations document. A template an endpoint still uses is refused (400) as
well: lorapod deletes the endpoint first.
"""

from __future__ import annotations

import secrets
from typing import Any

from .base import FakeControlPlane


class RunPodServerlessFake(FakeControlPlane):
    contract = "runpod-rest-v1.openapi.json"
    server_url = "https://rest.runpod.io/v1"

    def __init__(self, work_root, account_key: str | None = None) -> None:
        super().__init__(None, work_root, account_key)
        self.templates: dict[str, dict[str, Any]] = {}
        self.endpoints: dict[str, dict[str, Any]] = {}

    def route(self, method: str, path: str, body: Any, query: dict, auth: str) -> tuple[int, Any]:
        if auth != self.account_key:
            return 401, {"error": "Unauthorized"}
        if path == "/templates" and method == "POST":
            if any(t["name"] == body["name"] for t in self.templates.values()):
                return 400, {"error": f"template name {body['name']} is already taken"}
            tid = secrets.token_hex(5)
            self.templates[tid] = {"id": tid, "name": body["name"], "imageName": body["imageName"],
                                   "isServerless": bool(body.get("isServerless")), "env": dict(body.get("env") or {}),
                                   "containerDiskInGb": int(body.get("containerDiskInGb", 50)),
                                   "volumeInGb": int(body.get("volumeInGb", 20)), "category": body.get("category", "NVIDIA"),
                                   "isPublic": False, "isRunpod": False, "ports": list(body.get("ports") or []),
                                   "dockerEntrypoint": [], "dockerStartCmd": [], "readme": ""}
            return 200, dict(self.templates[tid])
        if path == "/endpoints" and method == "POST":
            tpl = self.templates.get(body["templateId"])
            if tpl is None:
                return 400, {"error": f"template {body['templateId']} not found"}
            eid = secrets.token_hex(7)
            self.endpoints[eid] = {
                "id": eid, "name": body.get("name", ""), "templateId": tpl["id"], "template": dict(tpl),
                "gpuTypeIds": list(body.get("gpuTypeIds") or []), "gpuCount": int(body.get("gpuCount", 1)),
                "workersMin": int(body.get("workersMin", 0)), "workersMax": int(body.get("workersMax", 3)),
                "idleTimeout": int(body.get("idleTimeout", 5)), "scalerType": body.get("scalerType", "QUEUE_DELAY"),
                "scalerValue": int(body.get("scalerValue", 4)), "computeType": body.get("computeType", "GPU"),
                "executionTimeoutMs": int(body.get("executionTimeoutMs", 600000)),
                "allowedCudaVersions": list(body.get("allowedCudaVersions") or []), "env": dict(tpl["env"]),
                "createdAt": "2026-12-01T00:00:00.000Z", "userId": "user_fake", "version": 0, "workers": []}
            return 200, dict(self.endpoints[eid])
        if path == "/endpoints" and method == "GET":  # ListEndpoints: an array of Endpoint
            return 200, [dict(e) for e in self.endpoints.values()]
        if path.startswith("/endpoints/"):
            eid = path.rsplit("/", 1)[1]
            if method == "GET":
                return (200, dict(self.endpoints[eid])) if eid in self.endpoints else (404, {"error": "not found"})
            if method == "DELETE":
                if self.endpoints.pop(eid, None) is None:
                    return 400, {"error": "Invalid endpoint ID"}
                return 204, None
        if path.startswith("/templates/") and method == "DELETE":
            tid = path.rsplit("/", 1)[1]
            if tid not in self.templates:
                return 400, {"error": "Invalid template ID"}
            if any(e["templateId"] == tid for e in self.endpoints.values()):
                return 400, {"error": "template is in use by an endpoint"}
            del self.templates[tid]
            return 204, None
        return 404, {"error": f"no route {method} {path}", "_undocumented": True}
