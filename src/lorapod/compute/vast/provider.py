"""Vast.ai as a :class:`~lorapod.compute.provider.Provider`.

Offers come from ``/api/v0/bundles/`` with the query :func:`offer_query` builds (the planner's
live prices use the same one): vast.py's defaults (verified, ``external: false``, rentable, not
rented), hosts whose driver can start the image (``cuda_max_good``), a reliability floor, at least
one direct port, and ``allocated_storage`` = the job's disk so ``dph_total`` is the price of the
instance lorapod will create (the search prices 8 GB otherwise). ``gpu_ram`` is in MB both ways
(vast.py ``offers_mult`` multiplies by 1000 and its table divides by 1000). An offer is rented with
``PUT /api/v0/asks/{id}/`` and the job's key attached; the key reaches the container a few seconds
later, which the session's readiness wait allows for. SSH goes direct (``public_ipaddr`` +
``ports["22/tcp"][0]["HostPort"]``, vast.py ``_ssh_url``) with the ``sshN.vast.ai`` proxy as the
fallback. ``onstart`` copies ``CONTAINER_ID`` and the scoped ``CONTAINER_API_KEY``
into a file only root can read (:data:`INSTANCE_ENV_FILE`, mode 0600; never the world-readable
``/etc/environment``) so the watchdog, started over SSH, can destroy the instance from inside. Vast.ai
bills storage while an instance exists in any state, so lorapod never stops, only destroys; an
``actual_status`` of exited/unknown/offline never becomes running and is treated as failed.

Interruptible (``Requirements.interruptible``): the search asks ``type: "bid"`` (vast.py
``search offers --interruptible``), each offer is bid at its ``min_bid`` when that is within
``max_bid_per_gpu_hour`` per GPU, and the create is the same ``PUT /asks/{id}/`` with ``price``, the
bid per machine ("Only for interruptible instances", the OpenAPI; vast.py ``create instance
--bid_price``; dstack PR 4025). Outbid, the instance is paused ("data preserved when paused but
instance not functional", vast-ai/docs instance-types.mdx): ``actual_status: stopped`` ("Disk
charges continue; no GPU charges", docs.vast.ai show-instance) with ``is_bid``, which
:meth:`VastProvider.refresh` reports as ``exited`` with ``interruptible`` set; it resumes by itself
if its bid wins again, or after :meth:`VastProvider.change_bid` raises it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from lorapod.catalog.billing import Billing
from lorapod.catalog.images import DEFAULTS, image_cuda
from lorapod.compute.provider import (
    HOST_OPTIONS,
    Capability,
    CreatedButUnusable,
    DoctorFacts,
    Instance,
    InstanceSpec,
    Offer,
    ProviderBase,
    Requirements,
    State,
    Traits,
    without,
)
from lorapod.compute.vast.api import VastApi
from lorapod.errors import ProviderError

if TYPE_CHECKING:
    from lorapod.catalog.gpus import GPU
    from lorapod.catalog.prices import PriceEntry

DEFAULT_IMAGE = DEFAULTS["vast"]
INSTANCE_ENV_FILE = "/root/.lorapod-instance.env"
MIN_RELIABILITY = 0.98  # every vast-ai/docs search example asks >= 0.99; cheapest-first favours flaky hosts
#: vast.py ``search__offers --type`` default; the OpenAPI enum spells it "ondemand" (review C.1)
OFFER_TYPE = "on-demand"


def onstart_script(path: str = INSTANCE_ENV_FILE) -> str:
    """The instance's start command: no tmux wrapping of sessions (vast-ai/docs: "We connect you
    to a tmux session by default ... ``touch ~/.no_auto_tmux``"; SkyPilot's Vast onstart does the
    same), then the scoped variables into a 0600 file, readable by root only."""
    import shlex

    q = shlex.quote(path)
    return (f"touch ~/.no_auto_tmux; umask 077 && env | grep -E '^(CONTAINER_ID|CONTAINER_API_KEY)=' > {q}.tmp && "
            f"chmod 600 {q}.tmp && mv {q}.tmp {q}")


DEAD = ("exited", "unknown", "offline")


# Vast.ai's gpu_name for each catalog GPU (40 GB and 80 GB A100s share names; gpu_ram tells them apart).
GPU_NAMES = {
    "RTX 3090": ["RTX 3090"],
    "RTX 4090": ["RTX 4090"],
    "RTX 5090": ["RTX 5090"],
    "RTX A6000": ["RTX A6000"],
    "A40": ["A40"],
    "L4": ["L4"],
    "L40S": ["L40S"],
    "A100 40GB": ["A100 PCIE", "A100 SXM4"],
    "A100 80GB": ["A100 PCIE", "A100 SXM4", "A100X"],
    "H100 PCIe": ["H100 PCIE", "H100 NVL"],
    "H100 SXM": ["H100 SXM"],
    "H200": ["H200", "H200 NVL"],
}


def offer_query(req: Requirements, image: str, verified: bool = True, limit: int = 64,
                gpu_names: list[str] | None = None) -> dict[str, Any]:
    """The ``/api/v0/bundles/`` search for ``req``: one builder for the runner and the planner."""
    query: dict[str, Any] = {
        "rentable": {"eq": True},
        "rented": {"eq": False},
        "external": {"eq": False},
        "num_gpus": {"eq": req.gpu_count},
        "disk_space": {"gte": req.disk_gb},
        "reliability": {"gte": MIN_RELIABILITY},
        "direct_port_count": {"gte": 1},
        "type": "bid" if req.interruptible else OFFER_TYPE,  # vast.py: --interruptible is type "bid"
        "allocated_storage": float(req.disk_gb),
        "order": [["dph_total", "asc"], ["reliability", "desc"]],
        "limit": limit,
    }
    if verified:
        query["verified"] = {"eq": True}
    cuda = image_cuda(image)
    if cuda:
        query["cuda_max_good"] = {"gte": float(cuda)}
    names = gpu_names or ([req.gpu.replace(" ", "_"), req.gpu] if req.gpu else None)
    if names:
        query["gpu_name"] = {"in": names}
    if req.min_vram_gb:
        query["gpu_ram"] = {"gte": req.min_vram_gb * 1000}
    if req.host_ram_gb:  # the instance's RAM, in MB like gpu_ram (vast.py offers_mult["cpu_ram"] = 1000)
        query["cpu_ram"] = {"gte": req.host_ram_gb * max(1, req.gpu_count) * 1000}
    if req.max_usd_per_hour is not None:
        query["dph_total"] = {"lte": req.max_usd_per_hour}
    return query


def price_request(gpus: list[GPU], disk_gb: float, limit: int = 200) -> dict[str, Any]:
    """The price list's search body: the runner's own query (single-GPU, the default image's
    hosts), for the GPUs asked for."""
    names = sorted({n for g in gpus for n in GPU_NAMES.get(g.name, [])})
    return offer_query(Requirements(disk_gb=float(disk_gb), gpu_count=1), DEFAULTS["vast"], limit=limit,
                       gpu_names=names)


def is_secure(offer: dict[str, Any]) -> bool:
    """A host fit for the job's secrets: a datacenter (SkyPilot's ``secure_only`` for Vast means
    ``datacenter`` / ``hosting_type >= 1``). "Verified" is only identity-checked: a third party
    still has root on the box."""
    ht = offer.get("hosting_type")
    return bool(offer.get("datacenter")) or (isinstance(ht, int | float) and ht >= 1)


class VastProvider(ProviderBase):
    name = "vast"
    #: the key attached after create reaches the container seconds later ("If authentication
    #: fails, try again after a few seconds", Vast's SSH banner): readiness waits for it
    traits = Traits(key_arrives_late=True, console_url="https://cloud.vast.ai/instances/")
    #: Each host sets its disk rate (an offer's ``storage_cost``, $/GB-month) and its bandwidth
    #: (``inet_down_cost`` / ``inet_up_cost``, $/GB); storage bills "while the instance exists, running
    #: or stopped" (vast-ai/docs). Spot: an outbid instance is paused, disk kept and billed ("Disk
    #: charges continue; no GPU charges", docs.vast.ai show-instance), with no documented signal first;
    #: it may resume if its bid wins again, so it is waited for 10 minutes (an assumption) first.
    billing = Billing(disk_rate_per_offer=True, bandwidth_per_gb=True, sigterm_grace_s=None, preempted="pauses",
                      resume_wait_min=10.0, source="vast-ai/docs instance-types.mdx; docs.vast.ai show-instance")
    #: the instance's own variables (vast-ai/docs docker-environment.mdx) and what `--spot` checks
    doctor = DoctorFacts(scoped=("CONTAINER_ID", "CONTAINER_API_KEY"), spot_checks=("bid",))

    #: the key ``lorapod plan --live`` reads Vast's prices with (:meth:`price_list`)
    price_key_env = "VAST_API_KEY"

    def __init__(self, api: VastApi | None = None, image: str = DEFAULT_IMAGE, verified: bool = True) -> None:
        self.api = api or VastApi()
        self.image = image
        self.verified = verified

    @classmethod
    def from_kwargs(cls, **kw: Any) -> VastProvider:
        return cls(**without(kw, *HOST_OPTIONS))

    @classmethod
    def price_list(cls, api_key: str, gpus: list[GPU], disk_gb: float, timeout_s: float) -> list[PriceEntry]:
        """The cheapest current offer per catalog GPU, found by the runner's own search
        (:func:`price_request`), priced ``dph_total`` with the job's disk in it."""
        from lorapod.catalog.prices import PriceEntry
        from lorapod.compute.live_prices import match_gpu, num

        api = VastApi(api_key, retries=1, backoff_s=0.2, timeout=timeout_s)
        try:
            offers = api.search_offers(price_request(gpus, disk_gb))
        finally:
            api.close()
        best: dict[str, PriceEntry] = {}
        for o in offers:
            if not isinstance(o, dict):
                continue
            ram = num(o.get("gpu_ram"))
            g = match_gpu(str(o.get("gpu_name", "")), ram / 1000 if ram else None)  # MB, as vast.py counts
            if g is None or not num(o.get("dph_total")):
                continue
            e = PriceEntry(
                "vast", "ondemand", g.name, float(o["dph_total"]), source="live",
                storage_per_gb_month=num(o.get("storage_cost")),
                download_per_gb=num(o.get("inet_down_cost")),
                upload_per_gb=num(o.get("inet_up_cost")),
                offer_id=str(o.get("id")),
                storage_included=True,
            )
            if g.name not in best or e.usd_per_hour < best[g.name].usd_per_hour:
                best[g.name] = e
        return list(best.values())

    def capabilities(self) -> list[Capability]:
        return [
            Capability("destroy", True, "DELETE /api/v0/instances/{id}/"),
            Capability("stop", False, "Vast.ai bills storage on a stopped instance; lorapod only destroys"),
            Capability("watchdog_api", True, "CONTAINER_API_KEY inside the instance"),
            Capability("network_volume", False, "a Vast.ai volume lives on one physical machine, not a region"),
            Capability("spot", True, "interruptible instances bid with price >= min_bid (PUT /asks/{id}/)"),
            Capability("spot_resume", True, "an outbid instance is paused with its disk and resumes when its bid "
                                            "wins again (or after change_bid raises it)"),
            Capability("deadman", True, "onstart starts the switch; CONTAINER_API_KEY (start, stop, destroy that "
                                        "instance only) destroys it"),
        ]

    def offers(self, req: Requirements) -> list[Offer]:
        query = offer_query(req, req.image or self.image or DEFAULT_IMAGE, self.verified)
        out = []
        for o in self.api.search_offers(query):
            if not isinstance(o, dict) or "id" not in o:
                continue
            extra = {k: o[k] for k in ("cuda_max_good", "datacenter") if isinstance(o.get(k), int | float | bool)}
            gpus = int(_num(o.get("num_gpus")) or 1)
            spot: dict[str, Any] = {}
            if req.interruptible:
                per_gpu = _num(o.get("min_bid")) / max(1, gpus)
                if not per_gpu or (req.max_bid_per_gpu_hour is not None and per_gpu > req.max_bid_per_gpu_hour):
                    continue
                spot = {"interruptible": True, "bid_per_gpu_hour": per_gpu, "spot_tier": "min_bid"}  # the catalog's tier
            out.append(Offer(self.name, str(o["id"]), str(o.get("gpu_name") or "?"), _num(o.get("dph_total")),
                             vram_gb=_num(o.get("gpu_ram")) / 1000, gpu_count=gpus,
                             storage_usd_per_gb_month=o.get("storage_cost"), reliability=o.get("reliability"),
                             region=o.get("geolocation"), extra=extra, secure=is_secure(o),
                             storage_included=True,  # dph_total prices allocated_storage (offer_query)
                             download_usd_per_gb=_rate(o.get("inet_down_cost")),
                             upload_usd_per_gb=_rate(o.get("inet_up_cost")), **spot))
        return out

    def create(self, offer: Offer, spec: InstanceSpec) -> Instance:
        body = {
            "image": spec.image or self.image,
            "label": spec.provider_label,
            "disk": float(spec.disk_gb),
            "runtype": "ssh_direct",
            "target_state": "running",
            "cancel_unavail": True,
            "onstart": onstart_script(),
        }
        if spec.deadman is not None and spec.deadman.after_s > 0:  # onstart is at most 4048 characters (OpenAPI)
            body["onstart"] = f"{body['onstart']}; " + replace(
                spec.deadman, recipe=self.api.self_destroy_recipe("")).launcher()
        spot = offer.interruptible
        if spot:  # the bid per machine, $/h
            body["price"] = round(float(offer.bid_per_gpu_hour or 0.0) * max(1, offer.gpu_count), 6)
        new_id = self.api.create_instance(int(offer.id), body)
        inst = Instance(id=str(new_id), provider=self.name, state="booting", usd_per_hour=offer.usd_per_hour,
                        gpu_name=offer.gpu_name, label=spec.provider_label, interruptible=spot)
        try:
            self.api.attach_ssh_key(new_id, spec.ssh_public_key)
        except ProviderError as exc:
            # Created but unreachable: hand the id back so the session records it and destroys it
            # with confirmation and retries (never a one-shot destroy that could lose the id).
            raise CreatedButUnusable(f"vast instance {new_id} was created but its SSH key could not be attached: "
                                     f"{exc.message}", inst, hint="lorapod destroys it and tries the next offer") from exc
        return inst

    def refresh(self, inst: Instance) -> Instance:
        data = self.api.show_instance(int(inst.id))
        if data is None:
            return inst.with_(state="gone")
        return self._instance(data, inst)

    def destroy(self, instance_id: str) -> None:
        self.api.destroy_instance(int(instance_id))

    def change_bid(self, instance_id: str, price: float) -> None:
        """Raise (or lower) an interruptible instance's bid per machine; a paused one resumes when it wins."""
        self.api.change_bid(int(instance_id), price)

    def list_instances(self) -> list[Instance]:
        return [self._instance(d, None) for d in self.api.list_instances()]

    def watchdog_config(self, inst: Instance) -> dict[str, Any]:
        return {"provider": "vast", "instance_id": inst.id, "api_url": self.api.base_url,
                "instance_env_file": INSTANCE_ENV_FILE, "destroy": self.api.self_destroy_recipe(inst.id)}

    def _instance(self, d: dict[str, Any], prev: Instance | None) -> Instance:
        status = str(d.get("actual_status") or "").lower()
        routes = ssh_routes(d)
        bid = bool(d.get("is_bid"))
        state: State
        if bid and status == "stopped":
            state = "exited"  # paused: outbid; data kept, storage billed, resumes if the bid wins again
        elif status in DEAD:
            state = "error"
        elif status == "running" and routes:
            state = "running"
        else:
            state = "booting"
        kw: dict[str, Any] = {"created_at": prev.created_at} if prev else {}
        host, port = routes[0] if routes and state == "running" else (None, 22)
        msg = "paused: outbid (data kept, storage billed)" if state == "exited" else d.get("status_msg")
        return Instance(id=str(d["id"]), provider=self.name, state=state,
                        usd_per_hour=_num(d.get("dph_total")) or (prev.usd_per_hour if prev else 0.0),
                        ssh_host=host, ssh_port=port, ssh_user="root", gpu_name=d.get("gpu_name"),
                        label=d.get("label"), message=str(msg)[:300] if msg else None,
                        pulling=status == "loading", ssh_alternates=tuple(routes[1:]) if state == "running" else (),
                        interruptible=bid or bool(prev and prev.interruptible), **kw)


def ssh_routes(d: dict[str, Any]) -> list[tuple[str, int]]:
    """Direct first, then the proxy (vast.py ``_ssh_url``): ``public_ipaddr`` +
    ``ports["22/tcp"][0]["HostPort"]`` when the port map has it, and ``ssh_host:ssh_port`` (the
    ``sshN.vast.ai`` proxy, "slower for data transfer"). Values from the host are checked: a port
    out of range or a non-string host is skipped."""
    out: list[tuple[str, int]] = []
    ports = d.get("ports")
    mapped = ports.get("22/tcp") if isinstance(ports, dict) else None
    ip = d.get("public_ipaddr")
    if isinstance(mapped, list) and mapped and isinstance(mapped[0], dict) and isinstance(ip, str) and ip.strip():
        port = _port(mapped[0].get("HostPort"))
        if port:
            out.append((ip.strip(), port))
    host, port = d.get("ssh_host"), _port(d.get("ssh_port"))
    if isinstance(host, str) and host.strip() and port and (host.strip(), port) not in out:
        out.append((host.strip(), port))
    return out


def _port(v: Any) -> int | None:
    try:
        p = int(str(v).strip())
    except (TypeError, ValueError):
        return None
    return p if 0 < p < 65536 else None


def _rate(v: Any) -> float | None:
    """A host's per-GB rate: a finite number >= 0, else None (unknown)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    x = float(v)
    return x if x == x and 0 <= x < float("inf") else None


def _num(v: Any) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return 0.0
    return x if x == x and x >= 0 else 0.0
