"""A fake Vast.ai (validated against vast.openapi.yaml): offers, create, attach key, show,
destroy, list. Each instance is a real sshd whose sessions see ``CONTAINER_ID`` and a scoped
``CONTAINER_API_KEY``. The document lists paths without the trailing slash Vast's CLI sends;
both are accepted.

What it does because the real one does (vast-ai/vast-cli ``vast.py`` @5567983, vast-ai/docs @c624622):

* ``GET /api/v0/instances/{id}/`` of a destroyed instance answers ``200 {"instances": null}``
  (``show__instance``: ``row = r.json()["instances"]; if row is None: ... "not found or no longer
  exists"``); the document has no such answer (erratum below).
* ``DELETE`` can answer 200 with ``{"success": false, "msg": ...}`` and leave the instance alive
  (``destroy_instance`` prints ``rj["msg"]`` when ``success`` is false): ``refuse_destroys``.
* ``ports`` is a Docker port map, and SSH has two routes (``_ssh_url``): direct
  ``public_ipaddr`` + ``ports["22/tcp"][0]["HostPort"]``, or the proxy ``ssh_host:ssh_port``
  (``sshN.vast.ai``; "slower for data transfer", guides/instances/connect/ssh.mdx). The proxy here
  is a relay on another port that counts its connections.
* The key attached after create works only a few seconds later ("If authentication fails, try
  again after a few seconds", the SSH banner in ssh.mdx): ``key_delay_s``, 5 s by default.
* While the image is pulled, ``actual_status`` is ``loading`` ("Docker image is downloading or
  container is starting up", docs.vast.ai show-instance): ``pull_s``.
* A host whose driver is older than the image's CUDA never starts the container; the instance
  ends ``exited`` with nvidia-container-cli's message (dizcza/docker-hashcat#21: "requirement error:
  unsatisfied condition: cuda>=12.8"). ``cuda_max_good`` is what a search filters it by
  (vast.py ``offers_alias``: ``cuda_vers -> cuda_max_good``).
* The scoped ``CONTAINER_API_KEY`` "can only start, stop, or destroy that specific instance"
  (api-reference/hello-world.mdx): ``DELETE`` and the ``state`` of ``PUT /api/v0/instances/{id}/``
  for its own instance; anything else with it (reading it, listing, searching, renting, another
  instance) is 401, as an account key that is not the account's.
* An offer's ``dph_total`` includes storage for the ``allocated_storage`` the search names, 8 GB
  when it names none (OpenAPI: "Default is 8GB"; vast.py always sends it), at the offer's
  ``storage_cost`` ($/GB/month); the instance then bills for the ``disk`` it was created with. Here
  the table's ``dph_total`` is the GPU part.
* Interruptible: a search with ``type: "bid"`` (vast.py ``--interruptible``) prices each offer at
  its ``min_bid`` plus the disk (gpuhunt PR 242, "Include disk price in spot offer price"); a create
  with ``price`` (the bid per machine, the OpenAPI's "Only for interruptible instances") makes an
  interruptible instance (``is_bid``). A bid below ``min_bid`` still creates it, but it never runs
  (dstack PR 4036 cleans up "stale spot instances that failed to start due to insufficient bid").
  :meth:`VastFake.outbid` is a higher bid winning the machine: the instance is **paused**
  ("data preserved when paused but instance not functional", vast-ai/docs instance-types.mdx):
  ``actual_status: stopped``, "Disk charges continue; no GPU charges" (docs.vast.ai show-instance),
  its processes stopped with no documented warning, its disk kept. It resumes by itself when the
  competing bid goes (:meth:`VastFake.outbid_ends`) or when ``PUT /api/v0/instances/bid_price/{id}/``
  (vast.py ``change__bid``) raises its bid above it. :meth:`VastFake.paused_storage_usd` is what the
  pauses billed.
* Searches honour every ``{op: value}`` filter on an offer field (vast.py ``parse_query`` builds
  exactly these: eq, neq, gt, gte, lt, lte, in, notin); ``gpu_ram`` is in MB, the unit vast.py
  multiplies by (``offers_mult["gpu_ram"] = 1000``) and displays divided by 1000.
"""

from __future__ import annotations

import itertools
import re
import secrets
import threading
import time
from typing import Any

from .base import Erratum, FakeControlPlane, TcpForwarder

#: offers as the search returns them; 9000 is the cheapest but its driver stops at CUDA 12.4, 9003
#: is an "external" (unverified, non-default) offer, 9004 a host with a poor reliability score.
OFFERS = [
    {"id": 9000, "ask_contract_id": 9000, "min_bid": 0.06, "cpu_ram": 32000, "gpu_name": "RTX 3090", "num_gpus": 1, "gpu_ram": 24576, "dph_total": 0.12,
     "reliability": 0.99, "storage_cost": 0.1, "inet_down_cost": 0.004, "inet_up_cost": 0.004,
     "geolocation": "Poland, PL", "rentable": True, "rented": False, "verified": True, "external": False,
     "verification": "verified", "cuda_max_good": 12.4, "direct_port_count": 10, "datacenter": False,
     "hosting_type": 0},
    {"id": 9001, "ask_contract_id": 9001, "min_bid": 0.09, "cpu_ram": 64000, "gpu_name": "RTX 3090", "num_gpus": 1, "gpu_ram": 24576, "dph_total": 0.19,
     "reliability": 0.995, "storage_cost": 0.1, "inet_down_cost": 0.005, "inet_up_cost": 0.005,
     "geolocation": "Spain, ES", "rentable": True, "rented": False, "verified": True, "external": False,
     "verification": "verified", "cuda_max_good": 12.8, "direct_port_count": 20, "datacenter": False,
     "hosting_type": 0},
    {"id": 9002, "ask_contract_id": 9002, "min_bid": 0.12, "cpu_ram": 128000, "gpu_name": "RTX 4090", "num_gpus": 1, "gpu_ram": 24564, "dph_total": 0.35,
     "reliability": 0.998, "storage_cost": 0.15, "inet_down_cost": 0.002, "inet_up_cost": 0.002,
     "geolocation": "US", "rentable": True, "rented": False, "verified": True, "external": False,
     "verification": "verified", "cuda_max_good": 12.9, "direct_port_count": 40, "datacenter": True,
     "hosting_type": 1},
    {"id": 9003, "ask_contract_id": 9003, "min_bid": 0.05, "cpu_ram": 32000, "gpu_name": "RTX 3090", "num_gpus": 1, "gpu_ram": 24576, "dph_total": 0.10,
     "reliability": 0.99, "storage_cost": 0.1, "inet_down_cost": 0.0, "inet_up_cost": 0.0,
     "geolocation": "US", "rentable": True, "rented": False, "verified": True, "external": True,
     "verification": "verified", "cuda_max_good": 12.8, "direct_port_count": 4, "datacenter": False,
     "hosting_type": 0},
    {"id": 9004, "ask_contract_id": 9004, "min_bid": 0.05, "cpu_ram": 32000, "gpu_name": "RTX 3090", "num_gpus": 1, "gpu_ram": 24576, "dph_total": 0.11,
     "reliability": 0.80, "storage_cost": 0.1, "inet_down_cost": 0.0, "inet_up_cost": 0.0,
     "geolocation": "BR", "rentable": True, "rented": False, "verified": True, "external": False,
     "verification": "verified", "cuda_max_good": 12.8, "direct_port_count": 4, "datacenter": False,
     "hosting_type": 0},
]

_OPS = {
    "eq": lambda a, b: a == b, "neq": lambda a, b: a != b, "gt": lambda a, b: a > b, "gte": lambda a, b: a >= b,
    "lt": lambda a, b: a < b, "lte": lambda a, b: a <= b, "in": lambda a, b: a in b, "notin": lambda a, b: a not in b,
}


def image_cuda(image: str) -> float | None:
    """The CUDA an image's base requires (``nvidia/cuda:X.Y.Z`` sets ``NVIDIA_REQUIRE_CUDA cuda>=X.Y``),
    read from the tag the way both tag schemes spell it: ``cuda12.8`` (pytorch/pytorch) and
    ``cu1281`` (runpod/pytorch 1.0.x)."""
    m = re.search(r"cuda(\d+)\.(\d+)", image) or re.search(r"-cu(\d\d)(\d)\d?\b", image)
    return float(f"{m.group(1)}.{m.group(2)}") if m else None


def price(offer: dict, disk_gb: float) -> float:
    """$/h of an instance from ``offer`` with ``disk_gb`` of storage (storage_cost is $/GB/month)."""
    return round(offer["dph_total"] + offer["storage_cost"] * disk_gb / 730.0, 6)


class VastFake(FakeControlPlane):
    contract = "vast.openapi.yaml"
    server_url = "https://console.vast.ai"
    errata = (
        # C.1: the enum says "ondemand"; vast.py (argument --type, default="on-demand"), the same
        # document's own example and hello-world.mdx send "on-demand".
        Erratum(("paths", "/api/v0/bundles", "post", "requestBody", "content", "application/json", "schema",
                 "properties", "type", "enum"),
                ["ondemand", "on-demand", "bid", "reserved"], "vast.py search__offers --type default 'on-demand'"),
        # C.2: typed as array<integer>; vast.py _ssh_url reads ports["22/tcp"][0]["HostPort"].
        Erratum(("components", "schemas", "Instance", "properties", "ports"),
                {"type": "object", "additionalProperties": {"type": "array"}}, "vast.py _ssh_url"),
        # C.3: no answer for a destroyed instance; vast.py show__instance reads instances: null.
        Erratum(("paths", "/api/v0/instances/{id}", "get", "responses", "200", "content", "application/json",
                 "schema", "properties", "instances"),
                {"oneOf": [{"$ref": "#/components/schemas/Instance"}, {"type": "null"}]}, "vast.py show__instance"),
        # C.4: typed as a Docker-flag string; vast.py sends parse_env(args.env), a dict, and
        # creating-instances-with-api.mdx says it "must be a JSON object (dict), not a Docker flag string".
        Erratum(("paths", "/api/v0/asks/{id}", "put", "requestBody", "content", "application/json", "schema",
                 "properties", "env"), {"type": "object", "additionalProperties": {"type": "string"}},
                "vast.py create__instance parse_env"),
    )

    def __init__(self, *a: Any, dead_offers: tuple[int, ...] = (), key_delay_s: float = 5.0,
                 direct_ssh: bool = True, direct_blocked: bool = False, refuse_destroys: int = 0, **kw: Any) -> None:
        super().__init__(*a, key_delay_s=key_delay_s, **kw)
        self.dead_offers = set(dead_offers)  # instances from these offers end "exited", never running
        self.direct_ssh = direct_ssh  # False: no ports["22/tcp"] (only the proxy route)
        self.direct_blocked = direct_blocked  # the map names a port nothing answers on
        self.refuse_destroys = refuse_destroys  # this many DELETEs answer 200 success:false and do nothing
        self.scoped: dict[str, str] = {}
        self.created_from: list[int] = []  # the offer id of every instance created
        self.bids: dict[str, float] = {}  # instance id -> its bid per machine (interruptible only)
        self.disks: dict[str, tuple[float, float]] = {}  # instance id -> (disk GB, storage $/GB-month)
        self.competing: dict[str, float] = {}  # instance id -> the higher bid that took its machine
        self._ids = itertools.count(70001)

    def route(self, method: str, path: str, body: Any, query: dict, auth: str) -> tuple[int, Any]:
        path = path.rstrip("/")
        m = re.fullmatch(r"/api/v0/instances/(\d+)", path)
        if m and method == "DELETE":
            iid = m.group(1)
            if auth != self.account_key and self.scoped.get(auth) != iid:
                return 401, {"success": False, "error": "auth_error", "msg": "Invalid user key"}
            inst = self.instances.get(iid)
            if inst is None or inst.deleted:
                return 404, {"success": False, "error": "not_found", "msg": "Instance not found"}
            if self.refuse_destroys > 0:
                self.refuse_destroys -= 1
                return 200, {"success": False, "msg": "Instance is busy; try again later"}
            self.kill_instance(inst, "account key" if auth == self.account_key else "container key")
            return 200, {"success": True, "msg": "Instance destroyed successfully"}
        if m and method == "PUT" and (auth == self.account_key or self.scoped.get(auth) == m.group(1)):
            return self._manage(m.group(1), body or {}, scoped=auth != self.account_key)
        if auth != self.account_key:
            # CONTAINER_API_KEY "can only start, stop, or destroy that specific instance"
            # (vast-ai/docs api-reference/hello-world.mdx): reading it, listing, renting are refused
            return 401, {"success": False, "error": "auth_error", "msg": "Invalid user key"}
        if path == "/api/v0/bundles" and method == "POST":
            allocated = float((body or {}).get("allocated_storage") or 8.0)
            bid = (body or {}).get("type") == "bid"
            priced = [{**o, "dph_total": price({**o, "dph_total": o["min_bid"]} if bid else o, allocated)}
                      for o in OFFERS]
            return 200, {"offers": [o for o in priced if self._match(o, body or {})]}
        m2 = re.fullmatch(r"/api/v0/asks/(\d+)", path)
        if m2 and method == "PUT":
            offer = next((o for o in OFFERS if o["id"] == int(m2.group(1))), None)
            if offer is None:
                return 404, {"success": False, "error": "invalid_args", "msg": "no_such_ask"}
            iid = str(next(self._ids))
            key = "ck-" + secrets.token_hex(12)
            bid = body.get("price")
            self.scoped[key] = iid
            self.created_from.append(offer["id"])
            need = image_cuda(body.get("image", ""))
            old = need is not None and offer["cuda_max_good"] < need
            why = (f"nvidia-container-cli: requirement error: unsatisfied condition: cuda>={need:g}, please "
                   f"update your driver to a newer version" if old else None)
            disk = float(body.get("disk") or 8.0)
            rate = price({**offer, "dph_total": float(bid)} if bid is not None else offer, disk)
            # onstart runs when the container starts, under bash, with the instance's variables
            # (vast-ai/docs docker-environment.mdx: predefined variables are visible to onstart)
            onstart = body.get("onstart")
            inst = self.start_instance(iid, None, {"CONTAINER_ID": iid, "CONTAINER_API_KEY": key},
                                       rate, offer["gpu_name"], body.get("label", ""),
                                       never_ready=offer["id"] in self.dead_offers or old, why_not=why,
                                       start_cmd=["bash", "-c", onstart] if onstart else None)
            self.disks[iid] = (disk, offer["storage_cost"])
            if bid is not None:
                self.bids[iid] = float(bid)
                if float(bid) < offer["min_bid"]:  # outbid from the start: created, never runs
                    self.competing[iid] = offer["min_bid"]
                    inst.stopped_at = time.time()
            inst.proxy = TcpForwarder(inst.sshd.port)
            if self.direct_blocked:
                from ..conftest_ssh import free_port

                inst.closed_port = free_port()  # nothing listens there: the direct route is down
            return 200, {"success": True, "new_contract": int(iid)}
        m4 = re.fullmatch(r"/api/v0/instances/bid_price/(\d+)", path)
        if m4 and method == "PUT":
            inst = self.instances.get(m4.group(1))
            if inst is None or inst.deleted or inst.id not in self.bids:
                return 400, {"success": False, "error": "invalid_args", "msg": "not an interruptible instance"}
            self.bids[inst.id] = float(body["price"])
            if inst.id in self.competing and self.bids[inst.id] > self.competing[inst.id]:
                self._resume(inst)
            return 200, {"success": True}
        m3 = re.fullmatch(r"/api/v0/instances/(\d+)/ssh", path)
        if m3 and method == "POST":
            inst = self.instances.get(m3.group(1))
            if inst is None or inst.deleted:
                return 404, {"success": False, "error": "not_found", "msg": "no such instance"}
            self.authorize_later(inst, body["ssh_key"])
            return 200, {"success": True, "msg": "SSH key attached successfully"}
        if m and method == "GET":
            inst = self.instances.get(m.group(1))
            if inst is None or inst.deleted:
                return 200, {"instances": None}
            return 200, {"instances": self._instance(inst)}
        if path == "/api/v1/instances" and method == "GET":
            items = [self._instance(i) for i in self.instances.values() if not i.deleted]
            return 200, {"success": True, "instances_found": len(items), "total_instances": len(items),
                         "next_token": None, "instances": items}
        return 404, {"success": False, "error": "not_found", "msg": path, "_undocumented": True}

    def _manage(self, iid: str, body: dict, scoped: bool) -> tuple[int, Any]:
        """``PUT /api/v0/instances/{id}/`` (manageInstance): ``state`` stopped or running (vast.py
        ``stop instance`` / ``start instance``), ``label``; the scoped key may change the state only."""
        inst = self.instances.get(iid)
        if inst is None or inst.deleted:
            return 404, {"success": False, "error": "not_found", "msg": "Instance not found"}
        if scoped and "label" in body:
            return 401, {"success": False, "error": "auth_error", "msg": "Invalid user key"}
        if "label" in body:
            inst.label = str(body["label"])
        if body.get("state") == "stopped" and inst.stopped_at is None:
            # docker stop: SIGTERM, SIGKILL 10 s later; the disk stays (and bills) until destroyed
            threading.Thread(target=self.stop_container, args=(inst, 10.0, False), daemon=True).start()
        elif body.get("state") == "running" and inst.stopped_at is not None and inst.id not in self.competing:
            threading.Thread(target=self.start_container, args=(inst,), daemon=True).start()
        return 200, {"success": True}

    def outbid(self, iid: str, competing: float, grace_s: float = 0.0) -> bool:
        """A bid of ``competing`` for this instance's machine; above its own, the instance pauses
        (no documented warning: ``grace_s`` 0 by default). True when it paused."""
        inst = self.instances[iid]
        if competing <= self.bids[iid]:
            return False
        self.competing[iid] = competing
        self.stop_container(inst, grace_s, erase_disk=False)  # data preserved when paused
        return True

    def outbid_ends(self, iid: str) -> None:
        """The competing bid goes away: the paused instance resumes by itself."""
        self._resume(self.instances[iid])

    def _resume(self, inst) -> None:
        self.competing.pop(inst.id, None)
        if inst.stopped_at is not None and not inst.deleted:
            self.start_container(inst)

    def paused_storage_usd(self, iid: str) -> float:
        """What the pauses billed: the disk only, at the offer's storage_cost per GB-month."""
        disk, per_gb_month = self.disks[iid]
        return self.instances[iid].hours_stopped() * disk * per_gb_month / 730

    def _match(self, offer: dict, q: dict) -> bool:
        for field, cond in q.items():
            if not isinstance(cond, dict) or field not in offer:
                continue
            for op, want in cond.items():
                have = offer[field]
                if field == "gpu_name":  # vast.py turns "RTX_3090" into "RTX 3090" (parse_query)
                    want = [w.replace("_", " ") for w in want] if isinstance(want, list) else str(want).replace("_", " ")
                if op in _OPS and not _OPS[op](have, want):
                    return False
        return True

    def _instance(self, inst) -> dict[str, Any]:
        status = ("stopped" if inst.stopped_at is not None else
                  "exited" if inst.never_ready and not inst.pulling else "loading" if not inst.ready else "running")
        ports: dict[str, Any] = {}
        if self.direct_ssh:
            host_port = getattr(inst, "closed_port", None) or inst.sshd.port
            ports["22/tcp"] = [{"HostIp": "0.0.0.0", "HostPort": str(host_port)}]
        return {"id": int(inst.id), "actual_status": status, "intended_status": "running", "label": inst.label,
                "ssh_host": "localhost", "ssh_port": inst.proxy.port, "public_ipaddr": "127.0.0.1", "ports": ports,
                "image_runtype": "ssh_direct ssh", "status_msg": inst.why_not if status == "exited" else
                ("Pulling image" if status == "loading" else "success, running"),
                "dph_total": inst.usd_per_hour, "gpu_name": inst.gpu, "num_gpus": 1, "is_bid": inst.id in self.bids,
                "cur_state": "stopped" if status == "stopped" else "running"}
