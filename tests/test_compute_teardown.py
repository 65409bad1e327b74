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
