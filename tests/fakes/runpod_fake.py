"""A fake RunPod: REST v1 pods (validated against runpod-rest-v1.openapi.json) + GraphQL
``gpuTypes`` and ``podTerminate``.

Each pod is a real sshd on loopback whose sessions see ``RUNPOD_POD_ID`` and a pod-scoped
``RUNPOD_API_KEY``. What it does because the real one does (or may, where only a live call
can tell; docs/remote.md lists those):

* A pod that is gone answers **400** to ``GET`` and ``DELETE /pods/{id}`` ("Invalid ID supplied" /
  "Invalid Pod ID" are the v1 document's only non-200 answers besides 404 and 401).
* ``POST /pods`` answers 400 "There are no longer any instances available with the requested
  specifications" when nothing matches (the message RunPod's GraphQL and REST refusals carry in
  public clients' recorded answers), and that happens for types the price list shows: the listing
  is not a stock signal. A type is out of stock when ``lowestPrice.uninterruptablePrice`` is null
  (runpodctl ``internal/api/gpu.go`` filters on stock; here the A4000 is listed but not rentable).
* Machines have a CUDA driver version, RAM and vCPUs per GPU. Without ``allowedCudaVersions`` the
  pod may land on a host older than the image, where the container never starts: the pod stays
  RUNNING with no public IP or port, as "RunPod schedules pods onto hosts that can't run the
  image" (artokun/comfyui-mcp#118). ``minRAMPerGPU`` / ``minVCPUPerGPU`` (v1 ``PodCreateInput``,
  defaults 8 and 2) choose among machines the same way.
* The pod-scoped key: whether REST v1 accepts it is documented nowhere (review row 6); the only
  documented in-pod use is ``runpodctl``, which speaks GraphQL (runpodctl ``api/pod.go``
  ``RemovePod``: ``mutation { podTerminate(input: {podId}) }`` and ``StopPod``: ``podStop``,
  runpodctl#149; RunPod's docs stop a pod from inside it with "sleep 2h; runpodctl stop pod
  $RUNPOD_POD_ID &", Manage Pods). So by default the fake refuses it on REST (401), accepts it for
  GraphQL ``podTerminate`` and ``podStop`` of its own pod and for nothing else (no listing, no
  prices, no rentals, no other pod); ``scoped_rest=True`` is the kinder world.
* While an image is pulled the pod is RUNNING with no IP and no port (dstack's
  ``wait_for_instance``: "the image must be pulled" before it runs); REST says nothing else.

Spot (interruptible) pods:

* GraphQL ``podRentInterruptable(input: PodRentInterruptableInput)`` with ``bidPerGpu`` rents one (the
  input's fields as SkyPilot's provisioner sends them, ``sky/provision/runpod/api/pods.py``; the
  current runpod-python has no such call); REST v1 ``POST /pods`` with ``interruptible: true`` too,
  at the listed spot price (the v1 document has no bid). A type with no
  ``lowestPrice.minimumBidPrice`` (the A40 here) and a type in ``no_spot_capacity_gpus`` answer
  the no-capacity message; a bid below the cloud's spot price (``secureSpotPrice`` /
  ``communitySpotPrice``) is refused with a GraphQL error (200 with ``errors``, as GraphQL answers;
  RunPod's wording for it is not published, so lorapod only ever bids the listed price).
* A spot pod bills its bid x GPUs (``costPerHr``): dstack issue 1890 shows a spot pod billed at
  its bid, not at the price shown.
* :meth:`RunPodFake.preempt` is RunPod taking it back (runpod/docs pods/pricing.mdx): "5-second
  warning (SIGTERM signal, followed by SIGKILL)", then the pod is stopped: ``desiredStatus:
  EXITED``, no IP or port (the GPU is released: pods/troubleshooting/zero-gpus.mdx), the container
  disk erased and the volume disk kept. Stopped, it bills only its volume disk, $0.20/GB-month
  (RunPod's storage prices, catalog/data/storage.yaml: container disk $0 stopped):
  :meth:`RunPodFake.stopped_usd_per_hour`. It stays listed until deleted.
"""

from __future__ import annotations

import os
import re
import secrets
from dataclasses import dataclass
from typing import Any

from .base import FakeControlPlane
from .vast_fake import image_cuda

NO_CAPACITY = "There are no longer any instances available with the requested specifications. Please refresh and try again."

GPU_TYPES = [
    {"id": "NVIDIA RTX A4000", "displayName": "RTX A4000", "memoryInGb": 16, "securePrice": 0.25,
     "communityPrice": 0.17, "secureSpotPrice": 0.12, "communitySpotPrice": 0.09,
     "lowestPrice": {"minimumBidPrice": None, "uninterruptablePrice": None}},  # listed, out of stock
    {"id": "NVIDIA GeForce RTX 3090", "displayName": "RTX 3090", "memoryInGb": 24, "securePrice": 0.43,
     "communityPrice": 0.22, "secureSpotPrice": 0.2, "communitySpotPrice": 0.11,
     "lowestPrice": {"minimumBidPrice": 0.11, "uninterruptablePrice": 0.22}},
    {"id": "NVIDIA GeForce RTX 4090", "displayName": "RTX 4090", "memoryInGb": 24, "securePrice": 0.69,
     "communityPrice": 0.34, "secureSpotPrice": 0.3, "communitySpotPrice": 0.2,
     "lowestPrice": {"minimumBidPrice": 0.2, "uninterruptablePrice": 0.34}},
    {"id": "NVIDIA A40", "displayName": "A40", "memoryInGb": 48, "securePrice": 0.44, "communityPrice": None,
     "secureSpotPrice": None, "communitySpotPrice": None,
     "lowestPrice": {"minimumBidPrice": None, "uninterruptablePrice": 0.44}},
]


@dataclass(frozen=True)
class Machine:
    gpu: str
    cloud: str
    cuda: float
    ram_per_gpu: int = 31
    vcpu_per_gpu: int = 8


#: in the order RunPod would place a pod; the first community 3090 host has an old driver
MACHINES = [
    Machine("NVIDIA GeForce RTX 3090", "COMMUNITY", 12.4, ram_per_gpu=15, vcpu_per_gpu=4),
    Machine("NVIDIA GeForce RTX 3090", "COMMUNITY", 12.8, ram_per_gpu=62, vcpu_per_gpu=8),
    Machine("NVIDIA GeForce RTX 3090", "SECURE", 12.8),
    Machine("NVIDIA GeForce RTX 4090", "COMMUNITY", 12.9),
    Machine("NVIDIA GeForce RTX 4090", "SECURE", 12.8),
    Machine("NVIDIA A40", "SECURE", 12.8, ram_per_gpu=50),
]


class RunPodFake(FakeControlPlane):
    contract = "runpod-rest-v1.openapi.json"
    server_url = "https://rest.runpod.io/v1"
    unvalidated = (r"/graphql",)  # GraphQL is not in the REST document (contracts/README.md)

    def __init__(self, *a: Any, never_ready_gpus: tuple[str, ...] = (), no_capacity_gpus: tuple[str, ...] = (),
                 scoped_rest: bool = False, machines: list[Machine] | None = None,
                 no_spot_capacity_gpus: tuple[str, ...] = (), **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.no_spot_capacity_gpus = set(no_spot_capacity_gpus)  # on-demand rentable, spot not
        self.docker_args: list[str] = []  # each spot pod's dockerArgs, as sent
        self.spot: dict[str, float] = {}  # pod id -> bid per GPU of an interruptible pod
        self.volume_gb: dict[str, int] = {}  # pod id -> its volume disk (kept while stopped)
        self.never_ready_gpus = set(never_ready_gpus)
        self.no_capacity_gpus = set(no_capacity_gpus)  # listed in stock, but create finds no machine
        self.scoped_rest = scoped_rest
        self.machines = list(MACHINES if machines is None else machines)
        self.pod_keys: dict[str, str] = {}  # pod-scoped key -> pod id
        self.placed: dict[str, Machine] = {}  # pod id -> the machine it landed on
        self.refuse_terminate = False  # GraphQL podTerminate answers an error (a provider refusing to destroy)

    @property
    def graphql_url(self) -> str:
        return self.url.rsplit("/v1", 1)[0] + "/v1/graphql"

    def route(self, method: str, path: str, body: Any, query: dict, auth: str) -> tuple[int, Any]:
        if path == "/graphql" and method == "POST":
            return self._graphql(body or {}, auth)
        m = re.fullmatch(r"/pods/([^/]+)", path)
        if m and method == "DELETE":
            pod_id = m.group(1)
            scoped_ok = self.scoped_rest and self.pod_keys.get(auth) == pod_id
            if auth != self.account_key and not scoped_ok:
                return 401, {"error": "Unauthorized"}
            inst = self.instances.get(pod_id)
            if inst is None or inst.deleted:
                return 400, {"error": "Invalid Pod ID"}
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
                return 400, {"error": "Invalid ID supplied"}
            return 200, self._pod(inst)
        return 404, None

    def _graphql(self, body: dict, auth: str) -> tuple[int, Any]:
        q = str(body.get("query") or "")
        if "podStop" in q:  # runpodctl api/pod.go StopPod: `mutation { podStop(input: {podId}) }`
            pod_id = (body.get("variables") or {}).get("podId") or (
                m.group(1) if (m := re.search(r'podId:\s*"([^"]+)"', q)) else None)
            if auth != self.account_key and self.pod_keys.get(auth) != pod_id:
                return 200, {"errors": [{"message": "Unauthorized"}], "data": None}
            inst = self.instances.get(str(pod_id))
            if inst is None or inst.deleted:
                return 200, {"errors": [{"message": "pod not found"}], "data": {"podStop": None}}
            import threading

            # a stopped pod: its container disk erased, its GPU released (pods/pricing.mdx)
            threading.Thread(target=self.stop_container, args=(inst, 5.0, True), daemon=True).start()
            return 200, {"data": {"podStop": {"id": inst.id, "desiredStatus": "EXITED"}}}
        if "podTerminate" in q:
            # runpodctl api/pod.go RemovePod sends the pod id as $podId; dstack inlines it
            pod_id = (body.get("variables") or {}).get("podId")
            if pod_id is None:
                found = re.search(r'podId:\s*"([^"]+)"', q)
                pod_id = found.group(1) if found else None
            if auth != self.account_key and self.pod_keys.get(auth) != pod_id:
                return 200, {"errors": [{"message": "Unauthorized"}], "data": None}  # GraphQL: 200 with errors
            if self.refuse_terminate:
                return 200, {"errors": [{"message": "Something went wrong. Please try again later."}], "data": None}
            inst = self.instances.get(str(pod_id))
            if inst is None or inst.deleted:
                return 200, {"errors": [{"message": "pod not found"}], "data": {"podTerminate": None}}
            self.kill_instance(inst, "account key" if auth == self.account_key else "pod-scoped key")
            return 200, {"data": {"podTerminate": None}}
        if auth != self.account_key:
            return 401, {"errors": [{"message": "Unauthorized"}]}
        if "podRentInterruptable" in q:
            return self._rent_interruptable((body.get("variables") or {}).get("input") or {})
        return 200, {"data": {"gpuTypes": GPU_TYPES}}

    def _rent_interruptable(self, inp: dict) -> tuple[int, Any]:
        """GraphQL answers 200 either way; a refusal is ``errors`` with ``data`` null."""
        need = ("name", "imageName", "gpuTypeId", "bidPerGpu", "volumeMountPath")  # SkyPilot's required fields
        missing = [k for k in need if inp.get(k) in (None, "")]
        if missing:
            return 200, {"errors": [{"message": f"missing {', '.join(missing)}"}], "data": None}
        body = {"gpuTypeIds": [inp["gpuTypeId"]], "cloudType": inp.get("cloudType") or "SECURE",
                "allowedCudaVersions": inp.get("allowedCudaVersions"), "imageName": inp["imageName"],
                "minRAMPerGPU": int(inp.get("minMemoryInGb") or 8) // max(1, int(inp.get("gpuCount") or 1)),
                "minVCPUPerGPU": int(inp.get("minVcpuCount") or 2) // max(1, int(inp.get("gpuCount") or 1)),
                "env": {e["key"]: e["value"] for e in inp.get("env") or []}, "name": inp["name"],
                "volumeInGb": inp.get("volumeInGb") or 0}
        if inp.get("dockerArgs"):
            # the container's command replaces the image's CMD (runpod-python create_pod docker_args):
            # the loopback "container" shows it as PID 1's command line (compute/doctor.py reads it)
            import shlex
            import tempfile

            argv = shlex.split(inp["dockerArgs"])
            last = argv[-1].split(";")[-1].replace("${IFS}", " ") if argv[:2] == ["sh", "-c"] else ""
            if last.startswith("exec "):  # `sh -c '...; exec CMD'`: PID 1 is CMD once it has run
                argv = last.split()[1:]
            fd, cmdline = tempfile.mkstemp(prefix="lp-pid1-cmdline-")
            os.write(fd, b"\0".join(a.encode() for a in argv) + b"\0")
            os.close(fd)
            body["env"]["LORAPOD_PID1_CMDLINE"] = cmdline
            body["dockerStartCmd"] = shlex.split(inp["dockerArgs"])  # the container's command, run at its start
            self.docker_args.append(inp["dockerArgs"])
        status, out = self._create(body, bid=float(inp["bidPerGpu"]))
        if status != 201:
            return 200, {"errors": [{"message": out["error"]}], "data": None}
        return 200, {"data": {"podRentInterruptable": {k: out[k] for k in ("id", "desiredStatus", "costPerHr")}
                              | {"machineId": "m-" + out["id"]}}}

    def preempt(self, pod_id: str, grace_s: float = 5.0) -> None:
        """RunPod takes the spot pod back: SIGTERM, SIGKILL ``grace_s`` later, then stopped."""
        inst = self.instances[pod_id]
        assert pod_id in self.spot, "only a spot pod is preempted"
        self.stop_container(inst, grace_s, erase_disk=True)  # the container disk is erased on stop

    def stopped_usd_per_hour(self, pod_id: str) -> float:
        """What a stopped pod bills: its volume disk at $0.20/GB-month (container disk: $0 stopped)."""
        return self.volume_gb.get(pod_id, 0) * 0.20 / 730

    def _create(self, body: dict, bid: float | None = None) -> tuple[int, Any]:
        gpu_id = body["gpuTypeIds"][0]
        gpu = next((g for g in GPU_TYPES if g["id"] == gpu_id), None)
        if gpu is None:
            return 400, {"error": f"no such GPU type {gpu_id}"}
        cloud = body.get("cloudType") or "SECURE"
        spot = bid is not None or bool(body.get("interruptible"))
        if spot:
            price = gpu["communitySpotPrice"] if cloud == "COMMUNITY" else gpu["secureSpotPrice"]
            stocked = (gpu.get("lowestPrice") or {}).get("minimumBidPrice") is not None
            if not price or not stocked or gpu_id in self.no_spot_capacity_gpus:
                return 400, {"error": NO_CAPACITY}
            if bid is not None and bid < price:
                return 400, {"error": f"bid ${bid} per GPU is below the current spot price"}
            price = bid if bid is not None else price
        else:
            price = gpu["communityPrice"] if cloud == "COMMUNITY" else gpu["securePrice"]
            stocked = (gpu.get("lowestPrice") or {}).get("uninterruptablePrice") is not None
        if not price or not stocked or gpu_id in self.no_capacity_gpus:
            return 400, {"error": NO_CAPACITY}
        allowed = [float(v) for v in body.get("allowedCudaVersions") or []]
        ram, vcpu = int(body.get("minRAMPerGPU", 8)), int(body.get("minVCPUPerGPU", 2))
        machine = next((mc for mc in self.machines if mc.gpu == gpu_id and mc.cloud == cloud
                        and (not allowed or mc.cuda in allowed) and mc.ram_per_gpu >= ram
                        and mc.vcpu_per_gpu >= vcpu), None)
        if machine is None:
            return 400, {"error": NO_CAPACITY}
        need = image_cuda(body.get("imageName", ""))
        too_old = need is not None and machine.cuda < need
        pod_id = secrets.token_hex(7)
        scoped = "pod-" + secrets.token_hex(12)
        self.pod_keys[scoped] = pod_id
        self.placed[pod_id] = machine
        env = {"RUNPOD_POD_ID": pod_id, "RUNPOD_API_KEY": scoped}
        if (body.get("env") or {}).get("LORAPOD_PID1_CMDLINE"):  # a spot pod's dockerArgs (_rent_interruptable)
            env["LORAPOD_PID1_CMDLINE"] = body["env"]["LORAPOD_PID1_CMDLINE"]
        # the container's command (REST dockerStartCmd, GraphQL dockerArgs) replaces the image's CMD
        # (v1 PodCreateInput: "overrides the start CMD for the Docker image"); run at its start
        start_cmd = list(body.get("dockerStartCmd") or []) or None
        inst = self.start_instance(pod_id, (body.get("env") or {}).get("PUBLIC_KEY"), env, float(price),
                                   gpu["displayName"], body.get("name", ""),
                                   never_ready=gpu_id in self.never_ready_gpus or too_old, start_cmd=start_cmd)
        if spot:
            self.spot[pod_id] = float(price)
        self.volume_gb[pod_id] = int(body.get("volumeInGb") or 0)
        return 201, self._pod(inst)

    def _pod(self, inst) -> dict[str, Any]:
        ready = inst.ready
        return {
            "id": inst.id, "name": inst.label, "desiredStatus": "EXITED" if inst.stopped_at else "RUNNING",
            "interruptible": inst.id in self.spot, "costPerHr": inst.usd_per_hour,
            "adjustedCostPerHr": inst.usd_per_hour, "image": "runpod/pytorch", "ports": ["22/tcp"],
            "publicIp": "127.0.0.1" if ready else None, "portMappings": {"22": inst.sshd.port} if ready else None,
            "gpu": {"id": inst.gpu, "count": 1, "displayName": inst.gpu},
            "env": {k: v for k, v in inst.env.items() if k != "RUNPOD_API_KEY"},
        }
