"""The ``local`` provider: this machine, through its own shell, with the remote-run lifecycle.

Useful to rehearse a remote run (watchdog, pulls, caps) without any SSH server, and as the
reference for what a borrowed host looks like. Work folders live in ``$LORAPOD_HOME/local``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lorapod.catalog.billing import Billing
from lorapod.compute.provider import Instance, Traits, without
from lorapod.compute.ssh import HostProvider
from lorapod.compute.transport import LocalTransport, Transport
from lorapod.home import lorapod_home


class LocalProvider(HostProvider):
    name = "local"
    traits = Traits(borrowed=True, runs_here=True)  # this process's own interpreter, nothing installed
    #: a machine you lend: the price you give it (--usd-per-hour) is all it costs, disk and bandwidth included
    billing = Billing(source="your own machine")

    def __init__(self, home: str | Path | None = None, usd_per_hour: float = 0.0) -> None:
        super().__init__(usd_per_hour)
        self.home = Path(home) if home else lorapod_home() / "local"

    @classmethod
    def from_kwargs(cls, **kw: Any) -> LocalProvider:
        return cls(**without(kw, "target", "identity"))

    def _address(self) -> tuple[str, int, str]:
        return "localhost", 0, "local"

    def _transport(self) -> Transport:
        return LocalTransport(self.home)

    def transport(self, inst: Instance, identity: Path | None, known_hosts: Path) -> Transport:
        return LocalTransport(self.home)

    def watchdog_config(self, inst: Instance) -> dict[str, Any]:
        return {"provider": "local"}
