"""A fake RunPod: REST v1 pods (validated against runpod-rest-v1.openapi.json) + GraphQL gpuTypes.

Each pod is a real sshd on loopback whose sessions see ``RUNPOD_POD_ID`` and a pod-scoped
``RUNPOD_API_KEY``, which may delete only that pod, as on RunPod. ``GET /pods/{id}`` of a
deleted pod answers 404 (as the contract allows).
"""

from __future__ import annotations

import re
import secrets
from typing import Any

from .base import FakeControlPlane

GPU_TYPES = [
    {"id": "NVIDIA GeForce RTX 3090", "displayName": "RTX 3090", "memoryInGb": 24, "securePrice": 0.43,
     "communityPrice": 0.22, "secureSpotPrice": 0.2, "communitySpotPrice": 0.11,
     "lowestPrice": {"minimumBidPrice": 0.11, "uninterruptablePrice": 0.22}},
    {"id": "NVIDIA GeForce RTX 4090", "displayName": "RTX 4090", "memoryInGb": 24, "securePrice": 0.69,
     "communityPrice": 0.34, "secureSpotPrice": 0.3, "communitySpotPrice": 0.2,
     "lowestPrice": {"minimumBidPrice": 0.2, "uninterruptablePrice": 0.34}},
    {"id": "NVIDIA A40", "displayName": "A40", "memoryInGb": 48, "securePrice": 0.44, "communityPrice": None,
     "secureSpotPrice": None, "communitySpotPrice": None, "lowestPrice": None},
]


class RunPodFake(FakeControlPlane):
    contract = "runpod-rest-v1.openapi.json"
    server_url = "https://rest.runpod.io/v1"
    unvalidated = (r"/graphql",)  # GraphQL is not in the REST document (contracts/README.md)

    def __init__(self, *a: Any, never_ready_gpus: tuple[str, ...] = (), **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.never_ready_gpus = set(never_ready_gpus)
        self.pod_keys: dict[str, str] = {}  # pod-scoped key -> pod id

    @property
    def graphql_url(self) -> str:
        return self.url.rsplit("/v1", 1)[0] + "/v1/graphql"

    def route(self, method: str, path: str, body: Any, query: dict, auth: str) -> tuple[int, Any]:
        if path == "/graphql" and method == "POST":
            if auth != self.account_key:
                return 401, {"errors": [{"message": "Unauthorized"}]}
            return 200, {"data": {"gpuTypes": GPU_TYPES}}
        m = re.fullmatch(r"/pods/([^/]+)", path)
        if m and method == "DELETE":
            pod_id = m.group(1)
            if auth != self.account_key and self.pod_keys.get(auth) != pod_id:
                return 401, {"error": "Unauthorized"}
            inst = self.instances.get(pod_id)
            if inst is None or inst.deleted:
                return 400, {"error": "pod not found"}
            self.kill_instance(inst, "account key" if auth == self.account_key else "pod-scoped key")
            return 204, None
        if auth != self.account_key:
            return 401, {"error": "Unauthorized"}
        if path == "/pods" and method == "POST":
            return self._create(body)
        if path == "/pods" and method == "GET":
            return 200, [self._pod(i) for i in self.instances.values() if not i.deleted]
        if m and method == "GET":
            inst = self.instances.get(m.group(1))
            if inst is None or inst.deleted:
                return 404, None
            return 200, self._pod(inst)
        return 404, None

    def _create(self, body: dict) -> tuple[int, Any]:
        gpu_id = body["gpuTypeIds"][0]
        gpu = next((g for g in GPU_TYPES if g["id"] == gpu_id), None)
        if gpu is None:
            return 400, {"error": f"no such GPU type {gpu_id}"}
        price = gpu["communityPrice"] if body.get("cloudType") == "COMMUNITY" else gpu["securePrice"]
        if not price:
            return 400, {"error": "There are no longer any instances available with the requested specifications."}
        pod_id = secrets.token_hex(7)
        scoped = "pod-" + secrets.token_hex(12)
        self.pod_keys[scoped] = pod_id
        env = {"RUNPOD_POD_ID": pod_id, "RUNPOD_API_KEY": scoped}
        inst = self.start_instance(pod_id, (body.get("env") or {}).get("PUBLIC_KEY"), env, float(price),
                                   gpu["displayName"], body.get("name", ""), never_ready=gpu_id in self.never_ready_gpus)
        return 201, self._pod(inst)

    def _pod(self, inst) -> dict[str, Any]:
        ready = inst.ready
        return {
            "id": inst.id, "name": inst.label, "desiredStatus": "RUNNING", "costPerHr": inst.usd_per_hour,
            "adjustedCostPerHr": inst.usd_per_hour, "image": "runpod/pytorch", "ports": ["22/tcp"],
            "publicIp": "127.0.0.1" if ready else None, "portMappings": {"22": inst.sshd.port} if ready else None,
            "gpu": {"id": inst.gpu, "count": 1, "displayName": inst.gpu},
            "env": {k: v for k, v in inst.env.items() if k != "RUNPOD_API_KEY"},
        }
