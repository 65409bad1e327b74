"""Raw HTTP to RunPod. Nothing else in lorapod talks to RunPod.

Contract: ``tests/contracts/runpod-rest-v1.openapi.json`` (RunPod REST API v1); prices come
from GraphQL, which that document does not cover (``tests/contracts/README.md``). Base URLs
can be overridden with ``LORAPOD_RUNPOD_URL`` and ``LORAPOD_RUNPOD_GRAPHQL_URL`` (tests use
local fakes).
"""

from __future__ import annotations

import os
from typing import Any

from lorapod.compute.httpapi import HttpApi, api_key, user_agent

REST_URL = "https://rest.runpod.io/v1"
GRAPHQL_URL = "https://api.runpod.io/graphql"

#: ``PodCreateInput.allowedCudaVersions`` enum of the v1 document, newest first
CUDA_VERSIONS = ("13.0", "12.9", "12.8", "12.7", "12.6", "12.5", "12.4", "12.3", "12.2", "12.1", "12.0", "11.8")

#: runpodctl ``api/pod.go`` ``RemovePod``, the mutation ``runpodctl remove pod`` sends
POD_TERMINATE = "mutation terminatePod($podId: String!) { podTerminate(input: {podId: $podId}) }"

#: A spot pod: REST v1's ``PodCreateInput`` has ``interruptible`` but no bid, so the bid goes through
#: GraphQL ``podRentInterruptable`` with ``bidPerGpu``, as SkyPilot's RunPod provisioner does
#: (``sky/provision/runpod/api/pods.py``: "Spot pods have no v2 endpoint yet and still go through the
#: GraphQL API"); the input's fields are those it sends (``PodRentInterruptableInput``)
RENT_INTERRUPTABLE = ("mutation BidPod($input: PodRentInterruptableInput!) { podRentInterruptable(input: $input) "
                      "{ id desiredStatus costPerHr machineId } }")

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

    def rent_interruptable(self, pod_input: dict[str, Any]) -> dict[str, Any]:
        """GraphQL ``podRentInterruptable`` (a spot pod at ``bidPerGpu``); the pod, or ApiError
        carrying GraphQL's own message (it answers 200 with ``errors``)."""
        resp = self.request("POST", self.graphql_url, json_body={"query": RENT_INTERRUPTABLE,
                                                                 "variables": {"input": pod_input}},
                            idempotent=False)
        body = resp.json()
        pod = (body.get("data") or {}).get("podRentInterruptable")
        if body.get("errors") or not isinstance(pod, dict):
            err = self.error(resp, "POST", "graphql podRentInterruptable")
            msgs = [str(e.get("message")) for e in body.get("errors") or [] if isinstance(e, dict)]
            if msgs:
                err.message = f"runpod refused the spot pod: {'; '.join(msgs)[:300]}"
            raise err
        return pod

    def create_pod(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /pods`` (operationId CreatePod; body PodCreateInput; 201 -> Pod)."""
        return self.request("POST", "/pods", json_body=body, ok=(200, 201), idempotent=False).json()

    def get_pod(self, pod_id: str) -> dict[str, Any] | None:
        """``GET /pods/{podId}`` (GetPod; 200 -> Pod). ``None`` when the pod does not exist: 404, or
        the document's other answer, 400 "Invalid ID supplied", which is what a pod id RunPod gave
        us gets once the pod is gone (review row 14)."""
        resp = self.request("GET", f"/pods/{pod_id}", allow=(400, 404))
        return None if resp.status_code in (400, 404) else resp.json()

    def delete_pod(self, pod_id: str) -> None:
        """``DELETE /pods/{podId}`` (DeletePod; 204). A pod already gone (404) is success."""
        self.request("DELETE", f"/pods/{pod_id}", ok=(200, 204), allow=(404,))

    def list_pods(self) -> list[dict[str, Any]]:
        """``GET /pods`` (ListPods; 200 -> Pods)."""
        return list(self.request("GET", "/pods").json() or [])

    def self_destroy_recipe(self, pod_id: str) -> dict[str, Any]:
        """How the watchdog deletes its own pod with the pod-scoped ``RUNPOD_API_KEY``, as data it
        interprets with the standard library (:func:`lorapod.compute.watchdog.run_recipe`); tried in
        order, the first that succeeds ends it. Only runpodctl's path is documented to work with
        that key (runpod/docs get-started/connect-to-runpod.mdx: every pod has ``runpodctl`` and a
        pod-scoped key; runpodctl#149: in-pod runpodctl speaks GraphQL); REST with it is not, so
        REST is one try among them. ``{NAME}`` is the instance's variable ``NAME``."""
        graphql = self.graphql_url
        return {
            "steps": [
                {"name": "GraphQL podTerminate", "kind": "http", "method": "POST", "url": graphql,
                 "token": "RUNPOD_API_KEY", "json": {"query": POD_TERMINATE, "variables": {"podId": "{RUNPOD_POD_ID}"}},
                 "done_status": [200], "done_json_key": "podTerminate"},
                {"name": "runpodctl remove pod", "kind": "exec",
                 "argv": ["runpodctl", "remove", "pod", "{RUNPOD_POD_ID}"], "env": ["RUNPOD_API_KEY"]},
                {"name": "REST DELETE", "kind": "http", "method": "DELETE", "url": f"{self.base_url}/pods/{{RUNPOD_POD_ID}}",
                 "token": "RUNPOD_API_KEY", "done_status": [200, 202, 204], "gone_status": [404]},
            ],
            "ids": {"RUNPOD_POD_ID": pod_id},
            "user_agent": user_agent("lorapod-watchdog"),
        }
