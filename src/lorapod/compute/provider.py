"""The provider interface: one small shape for ``ssh``, ``local``, ``runpod`` and ``vast``.

A provider only *asks*: ``create`` returns as soon as the provider accepted the request and
``refresh`` reports what the instance looks like now. All waiting (deadlines, backoff, timeout
errors) lives once, in :mod:`lorapod.compute.wait`, used by the stages, so no provider can block
forever.

The whole contract is on :class:`Provider`: the six methods, the watchdog's config, what the
provider *is* (:class:`Traits`, declared, never guessed from its name), what it *can* do
(:meth:`Provider.capabilities`, read through :func:`capability`), and optionally its own
``transport``. :class:`ProviderBase` gives the defaults of the optional parts; a new provider
subclasses it, and is one package plus one line in :data:`BUILTINS` (or a plugin's
:func:`register`; docs/architecture.md). What only some providers do is an optional interface
they implement (:class:`SupportsVolumes`, :class:`SupportsPriceList`), detected by type.

``destroy`` is idempotent: an instance that is already gone is success, because teardown runs
from several places (the controller's ``finally``, its signal handlers, the on-instance
watchdog, ``lorapod down``) and any of them may be second.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, runtime_checkable

from lorapod.catalog.billing import Billing, register_billing
from lorapod.errors import ProviderError

if TYPE_CHECKING:
    from pathlib import Path

    from lorapod.catalog.gpus import GPU
    from lorapod.catalog.prices import PriceEntry
    from lorapod.compute.deadman import DeadMan
    from lorapod.compute.transport import Transport
    from lorapod.plan.job import Job
    from lorapod.spec import JobSpec

#: Instance states, provider-neutral. ``gone`` means the provider confirmed it no longer exists.
State = Literal["creating", "booting", "running", "exited", "error", "gone"]
LIVE_STATES = ("creating", "booting", "running", "exited", "error")


@dataclass(frozen=True)
class Requirements:
    """What a job needs from a machine; providers filter their offers by it."""

    gpu: str | None = None
    min_vram_gb: float = 0.0
    max_usd_per_hour: float | None = None
    disk_gb: float = 50.0
    gpu_count: int = 1
    #: the container image (None: the provider's default); its CUDA decides which hosts can start it
    image: str | None = None
    #: host RAM per GPU the job needs (the planner's estimate; 0: the provider's default)
    host_ram_gb: float = 0.0
    #: interruptible (spot) offers instead of on-demand ones, each bidding at most this per GPU-hour
    #: (docs/remote.md, Spot); ``lorapod run`` asks for them when it runs on spot (compute/recovery.py)
    interruptible: bool = False
    max_bid_per_gpu_hour: float | None = None


@dataclass(frozen=True)
class Offer:
    """Something a provider would rent us now, at this price."""

    provider: str
    id: str
    gpu_name: str
    usd_per_hour: float
    vram_gb: float = 0.0
    gpu_count: int = 1
    storage_usd_per_gb_month: float | None = None
    reliability: float | None = None
    region: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: run by the provider or a host it verified (RunPod secure cloud, Vast.ai verified); secrets
    #: go only to these unless the user names them with --forward-env
    secure: bool = True
    #: the hourly price already covers the disk asked for (Vast.ai's ``dph_total`` with
    #: ``allocated_storage``), so the planner adds no storage charge
    storage_included: bool = False
    #: an interruptible (spot) offer: the provider's create bids ``bid_per_gpu_hour`` per GPU-hour
    #: (RunPod's ``bidPerGpu``, Vast.ai's ``price`` per machine = this x GPUs); ``spot_tier`` is the
    #: catalog's tier of its price, which the ledger measures preemption rates by (store/preemptions.py)
    interruptible: bool = False
    bid_per_gpu_hour: float | None = None
    spot_tier: str | None = None
    #: bandwidth billed per GB apart from the hourly price (Vast.ai's host rates), in the $ per job
    download_usd_per_gb: float | None = None
    upload_usd_per_gb: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class InstanceSpec:
    """How to start the machine: image, disk, the job's public key, a label for the console."""

    label: str
    ssh_public_key: str
    image: str | None = None  # None: the provider's default image (lorapod.catalog.images.DEFAULTS)
    disk_gb: float = 50.0
    name: str = ""  # the label at the provider (lorapod-<installation>-<instance>-<job>); see ledger.py
    #: the dead man's switch its start command carries (compute/deadman.py); None: none asked for.
    #: A provider that declares the ``deadman`` capability puts it in its start command.
    deadman: DeadMan | None = None

    @property
    def provider_label(self) -> str:
        return self.name or f"lorapod-{self.label}"


@dataclass(frozen=True)
class Instance:
    """A machine as the provider reports it. ``ssh_host`` is set once SSH can be tried."""

    id: str
    provider: str
    state: State
    usd_per_hour: float = 0.0
    ssh_host: str | None = None
    ssh_port: int = 22
    ssh_user: str = "root"
    gpu_name: str | None = None
    created_at: float = field(default_factory=time.time)
    label: str | None = None
    message: str | None = None
    #: the provider says the image is still being pulled (Vast.ai ``actual_status: loading``)
    pulling: bool = False
    #: other (host, port) routes to the same sshd, tried when the first does not answer
    #: (Vast.ai: direct ``public_ipaddr:HostPort`` first, its ``sshN.vast.ai`` proxy after)
    ssh_alternates: tuple[tuple[str, int], ...] = ()
    #: rented on the interruptible tier: ``exited`` then means the provider took it back (RunPod:
    #: stopped; Vast.ai: paused, outbid), not that the job ended
    interruptible: bool = False

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES

    @property
    def ssh_ready(self) -> bool:
        return self.state == "running" and bool(self.ssh_host)

    def with_(self, **changes: Any) -> Instance:
        return replace(self, **changes)


class CreatedButUnusable(ProviderError):
    """The provider created the instance but a follow-up step failed (e.g. attaching the SSH key).

    Carries the instance so the caller records it and destroys it with confirmation, instead
    of the provider trying once and losing its id when that fails too."""

    def __init__(self, message: str, instance: Instance, hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.instance = instance


class NoCapacity(ProviderError):
    """Create was refused for want of machines (RunPod: "There are no longer any instances
    available..."): nothing was rented, so the next offer is tried and this one does not count
    against ``max_offers``."""


@dataclass(frozen=True)
class Capability:
    """Whether a provider can do something, and why not when it cannot."""

    name: str
    supported: bool
    reason: str = ""


@dataclass(frozen=True)
class DoctorFacts:
    """What ``lorapod doctor`` looks for on a provider's instance (compute/doctor.py): the scoped
    variables the instance gets (never their values), and the spot checks that apply there."""

    #: the in-instance variables a self-destroy needs (RunPod's RUNPOD_POD_ID and pod-scoped
    #: RUNPOD_API_KEY; Vast.ai's CONTAINER_ID and CONTAINER_API_KEY)
    scoped: tuple[str, ...] = ()
    #: ``--spot`` checks: "bid" (the bid was taken), "sigterm path" (PID 1 passes SIGTERM on)
    spot_checks: tuple[str, ...] = ()


@dataclass(frozen=True)
class Traits:
    """What a provider is, declared once on its class; the stages read these, never its name.

    The defaults describe a machine rented for the job (RunPod, Vast.ai): a fresh SSH key per
    job, destroyed at the end, billed from create to confirmed destroy."""

    #: the user's own machine (``ssh://``, ``local``): their SSH keys and agent apply (no fresh key),
    #: "destroy" removes only lorapod's work folder, the disk is the host's (not asked for), and a
    #: work folder whose results could not come home is kept (KEEP) for ``lorapod pull``
    borrowed: bool = False
    #: the job runs on this machine under this very interpreter: no probe of an image, nothing installed
    runs_here: bool = False
    #: the job's SSH key reaches the instance seconds after it starts (Vast.ai), so "Permission
    #: denied" is retried for ``RunOptions.auth_grace_s``; elsewhere a refused key fails at once
    key_arrives_late: bool = False
    #: where a person checks and destroys an instance by hand (said when a destroy is unconfirmed)
    console_url: str | None = None


@runtime_checkable
class Provider(Protocol):
    """What every backend implements. Methods never sleep or poll.

    ``destroy`` is idempotent ("already gone" is success) and is confirmed only by ``refresh``
    answering ``gone`` for that instance (compute/teardown.py); ``list_instances`` lists the
    account's instances with the labels lorapod gave them, so a create that never answered can
    be found by its label."""

    name: str
    traits: ClassVar[Traits]
    #: the container image a create boots when the spec names none (None: the machine is what it is)
    image: str | None

    def capabilities(self) -> list[Capability]: ...

    def offers(self, req: Requirements) -> list[Offer]: ...

    def create(self, offer: Offer, spec: InstanceSpec) -> Instance: ...

    def refresh(self, inst: Instance) -> Instance: ...

    def destroy(self, instance_id: str) -> None: ...

    def list_instances(self) -> list[Instance]: ...

    def watchdog_config(self, inst: Instance) -> dict[str, Any]:
        """What the on-instance watchdog needs to destroy this instance from inside.

        Never the user's own API key: RunPod and Vast.ai give each instance a scoped one in
        its environment, which the watchdog reads there. A provider whose watchdog can destroy
        the instance through its API declares the ``watchdog_api`` capability and puts its
        self-destroy recipe under ``"destroy"`` (built from its ``api.py``, run by the
        standard-library watchdog); without one the watchdog removes the work folder.
        """
        ...

    def transport(self, inst: Instance, identity: Path | None, known_hosts: Path) -> Transport | None:
        """How to reach the instance; None: OpenSSH to its address with a host-key file of its own."""
        ...

    def cache_root(self) -> str | None:
        """A folder on the instance that outlives it (a mounted network volume) for the
        environment, model and latent caches; None: the work folder's own."""
        ...


class ProviderBase:
    """The documented defaults of the optional parts of :class:`Provider`: a rented machine
    (``Traits()``), reached over OpenSSH (``transport`` None), with no persistent cache and no
    default image, its billing unknown to the planner and no in-instance facts for ``doctor``
    until the class declares them (``billing``, ``doctor``)."""

    traits: ClassVar[Traits] = Traits()
    #: how it bills disk and bandwidth and what its spot tier does (catalog/billing.py): the planner
    #: prices its offers by it (storage, bandwidth, a preemption's husk and SIGTERM window)
    billing: ClassVar[Billing | None] = None
    #: what ``lorapod doctor`` checks on its instance (:class:`DoctorFacts`); None: not checkable
    doctor: ClassVar[DoctorFacts | None] = None
    image: str | None = None

    def transport(self, inst: Instance, identity: Path | None, known_hosts: Path) -> Transport | None:
        return None

    def cache_root(self) -> str | None:
        return None


def capability(provider: Provider, name: str) -> Capability:
    """The provider's declared capability ``name``; not declared means not supported, with why."""
    for cap in provider.capabilities():
        if cap.name == name:
            return cap
    return Capability(name, False, f"{provider.name} does not declare '{name}'")


# ----------------------------------------------------------------------------- optional interfaces

@runtime_checkable
class SupportsVolumes(Protocol):
    """A provider that mounts a network volume a run names (``compute.volume``): it finds or
    creates the volume, limits its own offers to where the volume is and mounts it in its creates.
    Callers detect it by type (dstack's ``ComputeWithVolumeSupport``, SkyPilot's ``supports()``),
    never by the provider's name, and nothing outside the provider changes its state."""

    def attach_volume(self, spec: JobSpec, name: str, job: Job | None, gpu: str | None,
                      max_usd: float | None, max_hours: float | None, say: Callable[[str], None]) -> object:
        """Find the volume called ``name`` (or create it where the job's GPU is) and use it from
        now on (said through ``say``); returns what was attached, the provider's own description."""
        ...


@runtime_checkable
class SupportsPriceList(Protocol):
    """A provider class whose current prices ``lorapod plan --live`` can read with the user's
    key from ``price_key_env`` (a classmethod: no instance, nothing rented)."""

    price_key_env: ClassVar[str]

    @classmethod
    def price_list(cls, api_key: str, gpus: list[GPU], disk_gb: float, timeout_s: float) -> list[PriceEntry]: ...



@runtime_checkable
class SupportsBid(Protocol):
    """A provider whose interruptible instance keeps its bid and can change it: a paused (outbid)
    instance resumes when its bid wins again (Vast.ai ``change bid``); compute/recovery.py raises
    it within the caps before it gives the husk up."""

    def change_bid(self, instance_id: str, price: float) -> None: ...

# ----------------------------------------------------------------------------- registry

class ProviderClass(Protocol):
    """What a registry entry is: a provider class, built with ``from_kwargs`` (the CLI's options)
    and read without building for its ``traits`` (no API key needed for that)."""

    traits: ClassVar[Traits]

    def from_kwargs(self, **kwargs: Any) -> Provider: ...


_REGISTRY: dict[str, ProviderClass] = {}

#: Built-ins and plugins are looked up alike (:func:`provider_class`); a built-in is imported
#: only when first used.
BUILTINS: dict[str, str] = {
    "ssh": "lorapod.compute.ssh:SSHProvider",
    "local": "lorapod.compute.local:LocalProvider",
    "runpod": "lorapod.compute.runpod.provider:RunPodProvider",
    "vast": "lorapod.compute.vast.provider:VastProvider",
}


def register(name: str, cls: ProviderClass) -> None:
    """Add a provider class under ``name`` (as :data:`BUILTINS` names theirs): it is built with
    ``cls.from_kwargs(**options)``, and its declared ``traits`` decide where it applies, so a
    plugin is preflighted and swept by ``down --orphans`` like a built-in. A second
    registration of the same name (or a built-in's name) is refused, so a plugin can never
    silently replace one and send teardown elsewhere."""
    if not name or not name.isidentifier():
        raise ValueError(f"provider name {name!r} must be a simple identifier")
    if name in _REGISTRY or name in BUILTINS:
        raise ValueError(f"provider '{name}' is already registered; pick another name")
    if not isinstance(cls, type) or not callable(getattr(cls, "from_kwargs", None)) \
            or not isinstance(getattr(cls, "traits", None), Traits):  # a factory function's traits cannot be read
        raise ValueError(f"provider '{name}' must be a class with from_kwargs() and declared traits "
                         "(subclass ProviderBase)")
    _REGISTRY[name] = cls
    _learn(name, cls)


HOST_OPTIONS = ("target", "identity", "usd_per_hour")  # what `lorapod run --on ssh://...` passes


def without(kw: dict[str, Any], *names: str) -> dict[str, Any]:
    """``kw`` less the options a provider does not take (``get`` passes every CLI option to all)."""
    return {k: v for k, v in kw.items() if k not in names}


def names() -> list[str]:
    return sorted({*BUILTINS, *_REGISTRY})


def on_hint() -> str:
    """What ``--on`` takes, from the registry (built-ins and plugins), for hints."""
    return " | ".join([*(n for n in names() if n != "ssh"), "ssh://user@host:port"])


def provider_class(name: str) -> ProviderClass:
    """The class registered as ``name``, built-in or plugin (imported on first use)."""
    if name in BUILTINS:
        import importlib

        module, _, cls = BUILTINS[name].partition(":")
        builtin: ProviderClass = getattr(importlib.import_module(module), cls)
        _learn(name, builtin)
        return builtin
    found = _REGISTRY.get(name)
    if found is None:
        raise ProviderError(
            f"unknown provider '{name}'",
            hint=f"use one of: {', '.join(names())}, or ssh://user@host:port",
        )
    return found


def _learn(name: str, cls: object) -> None:
    """The planner learns a provider's billing facts when its class is loaded or registered."""
    billing = getattr(cls, "billing", None)
    if isinstance(billing, Billing):
        register_billing(name, billing)


def load_facts() -> list[str]:
    """Load every registered provider class, built-in and plugin, so the planner knows how each
    bills (catalog/billing.py): what ``plan``, ``run`` and the dashboard call before planning.
    Returns the names loaded; a built-in that cannot be imported here is skipped."""
    loaded = []
    for name in names():
        try:
            provider_class(name)
        except (ImportError, AttributeError, ProviderError):
            continue
        loaded.append(name)
    return loaded


def doctor_facts(name: str) -> DoctorFacts | None:
    """What ``lorapod doctor`` checks on ``name``'s instances (its class's ``doctor``)."""
    try:
        facts = getattr(provider_class(name), "doctor", None)
    except (ImportError, AttributeError, ProviderError):
        return None
    return facts if isinstance(facts, DoctorFacts) else None


def get(name: str, **kwargs: Any) -> Provider:
    """Build the provider registered as ``name`` (``kwargs`` go to its ``from_kwargs``)."""
    return provider_class(name).from_kwargs(**kwargs)


def declared_traits(name: str) -> Traits | None:
    """The traits a registered provider's class declares, without building it (no API key
    needed); None for an unknown name or a class that cannot be imported here."""
    try:
        traits = provider_class(name).traits
    except (ImportError, AttributeError, ProviderError):
        return None
    return traits if isinstance(traits, Traits) else None


def rented_providers() -> list[str]:
    """The registered providers, built-in or plugin, that rent machines from an account (not
    borrowed hosts): where ``lorapod down --orphans`` and a damaged ledger's ``ps`` look for
    lorapod's labels."""
    return [name for name in [*BUILTINS, *sorted(_REGISTRY)]
            if (t := declared_traits(name)) is not None and not t.borrowed]


def from_target(target: str, **kwargs: Any) -> Provider:
    """``--on`` value -> provider: ``ssh://user@host:port`` or a registered name."""
    if target.startswith("ssh://"):
        return get("ssh", target=target, **kwargs)
    return get(target, **kwargs)


def rank_offers(offers: list[Offer], req: Requirements) -> list[Offer]:
    """Cheapest first among offers that satisfy ``req`` (GPU name, VRAM, price cap)."""
    wanted = _norm(req.gpu) if req.gpu else None
    keep = []
    for o in offers:
        if wanted and wanted not in _norm(o.gpu_name):
            continue
        if o.vram_gb and o.vram_gb < req.min_vram_gb:
            continue
        if req.max_usd_per_hour is not None and o.usd_per_hour > req.max_usd_per_hour:
            continue
        if o.gpu_count < req.gpu_count:
            continue
        keep.append(o)
    return sorted(keep, key=lambda o: (o.usd_per_hour, -(o.reliability or 0), o.id))


def _norm(s: str) -> str:
    return "".join(ch for ch in s.lower() if ch.isalnum())
