"""One confirm rule for every destroy (compute/teardown.py): ``lorapod run``'s teardown and
``lorapod down`` must agree on when an instance counts as gone, because the ledger stops counting
its dollars at that moment. The rule: only the provider's own answer about that instance
(``refresh`` -> ``gone``) confirms; being absent from ``list_instances`` does not, and a create
that never answered is "nothing was created" only when the provider's list could be read."""

from __future__ import annotations

import pytest

from lorapod.compute import jobs
from lorapod.compute.context import Claim, JobContext, RunOptions
from lorapod.compute.provider import Capability, Instance, Offer, ProviderBase
from lorapod.compute.teardown import destroy_claim
from lorapod.errors import ProviderError
from lorapod.rundir import RunDir
from lorapod.store.ledger import Ledger


class OneInstance(ProviderBase):
    """A provider whose list and per-instance answer can disagree. RunPod's ``GET /pods`` and
    Vast.ai's ``GET /instances/`` are account views (paged, filtered by owner), and the ssh
    provider's list is an ``ls ... || true`` of its work root: each can omit an instance its own
    ``GET /pods/{id}`` / ``show instance`` still reports."""

    name = "oneinst"

    def __init__(self, refresh_state: str, listing: str) -> None:
        self.refresh_state, self.listing, self.destroys = refresh_state, listing, 0

    def capabilities(self) -> list[Capability]:
        return []

    def destroy(self, instance_id: str) -> None:
        self.destroys += 1

    def refresh(self, inst: Instance) -> Instance:
        return inst.with_(state=self.refresh_state)

    def list_instances(self) -> list[Instance]:
        if self.listing == "fails":
            raise ProviderError("list refused (HTTP 503)")
        return []  # "empty": the instance is not listed


def _row(ledger: Ledger, provider_id: str | None) -> str:
    ledger_id = ledger.instance_creating("oneinst", "job1", 1.0, "GPU")
    if provider_id:
        ledger.instance_created(ledger_id, provider_id)
    return ledger_id


def _down(prov: OneInstance, provider_id: str | None, monkeypatch) -> tuple[bool, str]:
    ledger = Ledger()
    ledger_id = _row(ledger, provider_id)
    monkeypatch.setattr(jobs, "provider_for", lambda row, ledger: prov)
    ok = jobs.destroy_row(ledger, ledger.instance(ledger_id), "lorapod down", deadline_s=0.01, say=lambda m: None)
    return ok, ledger.instance(ledger_id).state


def _run(prov: OneInstance, provider_id: str | None, tmp_path) -> tuple[bool, str]:
    ledger = Ledger()
    ledger_id = _row(ledger, provider_id)
    opts = RunOptions(destroy_deadline_s=0.01, create_settle_s=0.0)
    ctx = JobContext(None, prov, "oneinst", opts, ledger, RunDir.create(tmp_path, "j"), "job1", lambda m: None)
    inst = Instance(provider_id, "oneinst", "running", label="job1") if provider_id else None
    claim = Claim(ledger_id, f"lorapod-x-{ledger_id}-job1", Offer("oneinst", "o", "GPU", 1.0), None, inst)
    done = destroy_claim(ctx, claim, "job over", has_work=True, watchdog_started=True)
    return done.confirmed, ledger.instance(ledger_id).state


@pytest.mark.parametrize(("refresh_state", "listing", "provider_id", "confirmed"), [
    ("gone", "empty", "i-1", True),  # the provider says so: confirmed
    ("running", "empty", "i-1", False),  # not listed, but its own answer says running: not confirmed
    ("running", "fails", None, False),  # create never answered, list unreadable: cannot say "nothing"
    ("running", "empty", None, True),  # create never answered, the list has no such label: nothing was created
])
def test_run_and_down_confirm_a_destroy_by_the_same_rule(refresh_state, listing, provider_id, confirmed,
                                                          monkeypatch, tmp_path):
    down = _down(OneInstance(refresh_state, listing), provider_id, monkeypatch)
    run = _run(OneInstance(refresh_state, listing), provider_id, tmp_path)
    assert down == run
    assert down[0] is confirmed
    live = {"destroying"}  # still billed until confirmed
    assert (down[1] in live) is not confirmed


def test_the_orphan_sweep_does_not_take_an_unlisted_instance_for_gone(monkeypatch):
    """down --orphans reconciles by the same rule: a live job's instance that the list omits but
    the provider still reports running is neither marked destroyed nor destroyed."""
    from lorapod.store.identity import controller_id

    ledger = Ledger()
    ledger.job_started("job1", "/tmp/run", "oneinst", "oneinst", None, None, None)
    assert ledger.job("job1").controller == controller_id()  # followed by this (live) process
    ledger_id = _row(ledger, "i-1")
    ledger.job_update("job1", state="running", instance_id=ledger_id)
    prov = OneInstance("running", "empty")
    monkeypatch.setattr(jobs, "provider_for", lambda row, ledger: prov)
    counts = jobs.down_orphans(ledger, say=lambda m: None)
    assert (counts["reconciled"], counts["destroyed"], prov.destroys) == (0, 0, 0)
    assert ledger.instance(ledger_id).live
    prov.refresh_state = "gone"  # now the provider says so itself
    assert jobs.down_orphans(ledger, say=lambda m: None)["reconciled"] == 1
    assert not ledger.instance(ledger_id).live


class LabelledPlugin(ProviderBase):
    """A plugin provider (registered as a class) renting from an account, whose account holds one
    instance with this installation's label that the ledger never heard of (a create that crashed
    before the ledger learned its id). ``refresh_state`` is what the provider says after a destroy."""

    name = "plugin_swept"
    refresh_state = "running"
    destroys: list[str] = []

    @classmethod
    def from_kwargs(cls, **kw):
        return cls()

    def capabilities(self) -> list[Capability]:
        return []

    def destroy(self, instance_id: str) -> None:
        self.destroys.append(instance_id)

    def refresh(self, inst: Instance) -> Instance:
        return inst.with_(state=self.refresh_state)

    def list_instances(self) -> list[Instance]:
        from lorapod.store.identity import instance_label

        return [Instance("p-1", self.name, "running", label=instance_label("i-0123456789ab", "lost-job"))]


@pytest.mark.parametrize("refresh_state", ["running", "gone"])
def test_an_unknown_instance_counts_as_destroyed_only_when_the_provider_confirms(refresh_state, monkeypatch):
    """down --orphans' sweep of labelled instances the ledger lacks goes through the same confirm
    rule: a destroy the provider does not confirm is reported as not confirmed (failed, named),
    never as destroyed. Plugins are swept like built-ins (their class's traits say they rent)."""
    from lorapod.compute import provider as registry

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    registry.register(LabelledPlugin.name, LabelledPlugin)
    monkeypatch.setattr(LabelledPlugin, "refresh_state", refresh_state)
    monkeypatch.setattr(LabelledPlugin, "destroys", [])
    assert LabelledPlugin.name in registry.rented_providers()
    said: list[str] = []
    counts = jobs.down_orphans(Ledger(), say=said.append, deadline_s=0.01)
    assert counts["providers"][LabelledPlugin.name].startswith("asked")
    assert LabelledPlugin.destroys  # the plugin's account was swept
    if refresh_state == "gone":
        assert (counts["unknown_destroyed"], counts["failed"], counts["unconfirmed"]) == (1, 0, [])
    else:
        assert (counts["unknown_destroyed"], counts["failed"], counts["unconfirmed"]) == (0, 1, ["p-1"])
        assert any("could NOT confirm" in m and "p-1" in m for m in said)
