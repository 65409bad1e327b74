"""Raw HTTP to RunPod. Nothing else in lorapod talks to RunPod.

Contract: ``tests/contracts/runpod-rest-v1.openapi.json`` (RunPod REST API v1); prices come
from GraphQL, which that document does not cover (``tests/contracts/README.md``). Base URLs
can be overridden with ``LORAPOD_RUNPOD_URL`` and ``LORAPOD_RUNPOD_GRAPHQL_URL`` (tests use
local fakes).
"""

from __future__ import annotations

import os
from typing import Any

from lorapod.compute.httpapi import HttpApi, api_key

REST_URL = "https://rest.runpod.io/v1"
GRAPHQL_URL = "https://api.runpod.io/graphql"

GPU_TYPES_QUERY = (
    "query GpuTypes { gpuTypes { id displayName memoryInGb securePrice communityPrice secureSpotPrice "
    "communitySpotPrice lowestPrice(input: {gpuCount: 1}) { minimumBidPrice uninterruptablePrice } } }"
)


class RunPodApi(HttpApi):
    provider = "runpod"

    def __init__(self, key: str | None = None, base_url: str | None = None, graphql_url: str | None = None,
                 **kw: Any) -> None:
        super().__init__(base_url or os.environ.get("LORAPOD_RUNPOD_URL") or REST_URL,
                         key or api_key("RUNPOD_API_KEY", "runpod"), **kw)
        self.graphql_url = graphql_url or os.environ.get("LORAPOD_RUNPOD_GRAPHQL_URL") or GRAPHQL_URL

    def gpu_types(self) -> list[dict[str, Any]]:
        """GPU types with prices: ``POST {graphql}`` query ``gpuTypes`` (contracts/README.md)."""
        resp = self.request("POST", self.graphql_url, json_body={"query": GPU_TYPES_QUERY})
        body = resp.json()
        if body.get("errors"):
            raise self.error(resp, "POST", "graphql gpuTypes")
        return list(((body.get("data") or {}).get("gpuTypes")) or [])

    def create_pod(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /pods`` (operationId CreatePod; body PodCreateInput; 201 -> Pod)."""
        return self.request("POST", "/pods", json_body=body, ok=(200, 201), idempotent=False).json()

    def get_pod(self, pod_id: str) -> dict[str, Any] | None:
        """``GET /pods/{podId}`` (GetPod; 200 -> Pod). ``None`` when the pod does not exist (404)."""
        resp = self.request("GET", f"/pods/{pod_id}", allow=(404,))
        return None if resp.status_code == 404 else resp.json()

    def delete_pod(self, pod_id: str) -> None:
        """``DELETE /pods/{podId}`` (DeletePod; 204). A pod already gone (404) is success."""
        self.request("DELETE", f"/pods/{pod_id}", ok=(200, 204), allow=(404,))

    def list_pods(self) -> list[dict[str, Any]]:
        """``GET /pods`` (ListPods; 200 -> Pods)."""
        return list(self.request("GET", "/pods").json() or [])
