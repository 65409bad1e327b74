"""The ``ssh`` provider: any Linux host you can log into (``--on ssh://user@host:port``).

The machine is not ours, so "create" only names a work folder for the job, and "destroy" stops
the job (and its watchdog) and deletes that folder, never the machine. The ``local`` provider
(:mod:`lorapod.compute.local`) is the same with this machine's shell instead of SSH.
"""

from __future__ import annotations

import re
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from lorapod.catalog.billing import Billing
from lorapod.compute.provider import (
    Capability,
    Instance,
    InstanceSpec,
    Offer,
    ProviderBase,
    Requirements,
    Traits,
)
from lorapod.compute.remote import teardown_script, work_root
from lorapod.compute.transport import SSHTransport, Transport
from lorapod.errors import ProviderError
from lorapod.home import lorapod_home


@dataclass(frozen=True)
class SSHTarget:
    user: str
    host: str
    port: int = 22

    @classmethod
    def parse(cls, target: str) -> SSHTarget:
        """``ssh://user@host:port`` (user defaults to root, port to 22)."""
        u = urlparse(target if "://" in target else f"ssh://{target}")
        if u.scheme != "ssh" or not u.hostname:
            raise ProviderError(f"'{target}' is not an SSH address", hint="write it as ssh://user@host:port")
        try:
            port = u.port or 22
        except ValueError as exc:
            raise ProviderError(f"'{target}' has a bad port", hint="write it as ssh://user@host:port") from exc
        return cls(u.username or "root", u.hostname, port)

    def __str__(self) -> str:
        return f"ssh://{self.user}@{self.host}:{self.port}"


class HostProvider(ProviderBase):
    """A machine we borrow: instances are work folders ``~/.lorapod-work/<label>``."""

    name = "ssh"
    traits = Traits(borrowed=True)  # the machine is not ours: destroy = remove our work folder
    #: a machine you lend: the price you give it (--usd-per-hour) is all it costs, disk and bandwidth included
    billing = Billing(source="your own machine")

    def __init__(self, usd_per_hour: float = 0.0) -> None:
        self.usd_per_hour = usd_per_hour
        self._created: set[str] = set()  # named by this process: the folder may not exist yet
        self._destroyed: set[str] = set()

    # subclasses: _transport(), _address()
    def _transport(self) -> Transport:
        raise NotImplementedError

    def _address(self) -> tuple[str, int, str]:
        raise NotImplementedError

    def capabilities(self) -> list[Capability]:
        return [
            Capability("create", True, "names a work folder on the host; the machine already exists"),
            Capability("destroy", True, "stops the job and deletes its work folder; never the machine"),
            Capability("stop", False, "the machine is not ours to stop"),
            Capability("watchdog_api", False, "the watchdog cleans the work folder instead"),
        ]

    def offers(self, req: Requirements) -> list[Offer]:
        host, port, user = self._address()
        # the host has the GPUs it has: compute.gpus is taken at its word (torchrun fails clearly if short)
        return [Offer(self.name, f"{user}@{host}:{port}", req.gpu or "this host", self.usd_per_hour,
                      gpu_count=req.gpu_count)]

    def create(self, offer: Offer, spec: InstanceSpec) -> Instance:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", spec.label):
            raise ProviderError(f"bad instance label {spec.label!r}")
        host, port, user = self._address()
        self._created.add(spec.label)
        return Instance(id=f"{offer.id}/{spec.label}", provider=self.name, state="running",
                        usd_per_hour=offer.usd_per_hour, ssh_host=host, ssh_port=port, ssh_user=user,
                        gpu_name=offer.gpu_name, label=spec.label)

    def refresh(self, inst: Instance) -> Instance:
        """Ready at once (the machine exists) for an instance this process named, whose folder
        the session has yet to make; otherwise what the host says: ``gone`` when the work folder
        is not there (after destroy(), or seen from another process: ``lorapod down``)."""
        label = self._label(inst.id)
        if label in self._created and label not in self._destroyed:
            return inst
        t = self._transport()
        try:
            out = t.run(f"test -d {shlex.quote(work_root() + '/' + label)} && echo yes || echo no",
                        timeout=30)
        finally:
            t.close()
        return inst.with_(state="running" if out.stdout.strip() == b"yes" else "gone")

    def _label(self, instance_id: str) -> str:
        label = instance_id.rsplit("/", 1)[-1]
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", label) or label in (".", ".."):
            raise ProviderError(f"bad instance id {instance_id!r}")
        return label

    def destroy(self, instance_id: str) -> None:
        """Stop the job and remove its folder; a folder already gone is success."""
        t = self._transport()
        try:
            out = t.run(teardown_script(f"{work_root()}/{self._label(instance_id)}"), timeout=60)
            if b"LPOK" not in out.stdout:
                raise ProviderError(f"teardown of {instance_id} did not confirm")
            self._destroyed.add(self._label(instance_id))
        finally:
            t.close()

    def list_instances(self) -> list[Instance]:
        t = self._transport()
        try:
            out = t.run(f"ls -1 {shlex.quote(work_root())} 2>/dev/null || true", timeout=30)
        finally:
            t.close()
        host, port, user = self._address()
        return [Instance(id=f"{user}@{host}:{port}/{label}", provider=self.name, state="running",
                         usd_per_hour=self.usd_per_hour, ssh_host=host, ssh_port=port, ssh_user=user,
                         label=label, created_at=time.time())
                for label in out.stdout.decode().split() if label]

    def watchdog_config(self, inst: Instance) -> dict[str, Any]:
        return {"provider": "ssh"}


class SSHProvider(HostProvider):
    name = "ssh"

    def __init__(self, target: str, identity: str | Path | None = None, usd_per_hour: float = 0.0,
                 connect_timeout: float = 10.0) -> None:
        super().__init__(usd_per_hour)
        self.target = SSHTarget.parse(target)
        self.identity = Path(identity).expanduser() if identity else None
        self.connect_timeout = connect_timeout
        # Your own host: what your ~/.ssh/known_hosts says about it counts (a mismatch is refused).
        self.user_known_hosts = (Path.home() / ".ssh" / "known_hosts",)

    @classmethod
    def from_kwargs(cls, target: str | None = None, **kw: Any) -> SSHProvider:
        if not target:
            raise ProviderError("the ssh provider needs an address", hint="--on ssh://user@host:port")
        return cls(target, **kw)

    def _address(self) -> tuple[str, int, str]:
        return self.target.host, self.target.port, self.target.user

    def known_hosts(self) -> Path:
        # Per host:port, so a host key is pinned on first use and any change is refused.
        return lorapod_home() / "known_hosts" / f"{self.target.host}_{self.target.port}"

    def _transport(self) -> Transport:
        return SSHTransport(self.target.host, self.target.port, self.target.user, self.identity,
                            self.known_hosts(), connect_timeout=self.connect_timeout, control_master=False,
                            user_known_hosts=self.user_known_hosts)

    def transport(self, inst: Instance, identity: Path | None, known_hosts: Path) -> Transport:
        return SSHTransport(inst.ssh_host or self.target.host, inst.ssh_port, inst.ssh_user,
                            identity or self.identity, self.known_hosts(), connect_timeout=self.connect_timeout,
                            user_known_hosts=self.user_known_hosts)
