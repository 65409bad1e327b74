"""Acquire: from the ranked offers to an instance whose SSH answers, or nothing rented.

``offers -> (per offer) ledger row -> create (never blindly retried) -> wait for boot, then SSH,
under one deadline -> Lease``. An offer that gives no usable instance is destroyed (with
confirmation) and the next is tried; a refusal for want of capacity rents nothing and does not
count against ``max_offers``. What is rented at any moment is ``ctx.claim``, so teardown can give
it back whatever ends the stage.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path

from lorapod.compute.context import Claim, Interrupted, JobContext
from lorapod.compute.httpapi import ApiError
from lorapod.compute.offers import OfferEstimate, choose_offers
from lorapod.compute.provider import CreatedButUnusable, Instance, InstanceSpec, NoCapacity, Offer, Provider
from lorapod.compute.teardown import destroy_claim, find_by_label, job_key_dir
from lorapod.compute.transport import (
    AuthRefused,
    ConnectionLost,
    SSHTransport,
    Transport,
    ephemeral_key,
    public_key,
)
from lorapod.compute.wait import WaitTimedOut, backoff_until
from lorapod.errors import BudgetError, LorapodError, ProviderError
from lorapod.store.identity import instance_label


@dataclass(frozen=True)
class Lease:
    """An instance that answers on SSH, and everything known about how it was rented."""

    ledger_id: str
    provider_id: str
    instance: Instance
    offer: Offer
    label: str
    identity: Path | None
    transport: Transport
    created_at_mono: float
    #: the planner's estimate for the offer rented (None: it cannot estimate this job or GPU);
    #: the default $ cap and the pull guard read it
    estimate: OfferEstimate | None = None


def acquire(ctx: JobContext, interruptible: bool = False) -> Lease:
    """The first offer that gives an instance answering on SSH; ``interruptible``: spot offers
    only (their bids within the ceiling; compute/recovery.py falls back to on-demand)."""
    o = ctx.opts
    ranked = choose_offers(ctx.spec, ctx.provider, o.gpu, ctx.max_usd, ctx.max_hours, job=ctx.job,
                           interruptible=interruptible)
    ctx.ledger.record_prices([r.offer for r in ranked])
    identity, pub = _job_key(ctx)
    errors = []
    tried = 0
    for choice in ranked:
        offer = choice.offer
        if tried >= o.max_offers:
            break
        try:
            claim, inst = _create(ctx, offer, identity, pub)
            tried += 1
            return wait_ready(ctx, claim, inst, choice.estimate)
        except NoCapacity as exc:  # nothing was rented: this offer does not count
            errors.append(f"{offer.gpu_name} ({offer.id}): {exc.message}")
            ctx.say(f"offer {offer.id}: {exc.message}; trying the next")
            ctx.claim = None
            continue
        except (AuthRefused, BudgetError, Interrupted):
            raise
        except (WaitTimedOut, ProviderError, ConnectionLost) as exc:
            if isinstance(exc, ApiError) and exc.fatal:  # bad key, no balance: no other offer will do better
                if ctx.claim is not None and destroy_claim(ctx, ctx.claim, "create refused", False, False).confirmed:
                    ctx.claim = None
                raise
            errors.append(f"{offer.gpu_name} ({offer.id}): {exc.message}")
            ctx.say(f"offer {offer.id} failed: {exc.message}")
            _give_back(ctx, "not ready before the deadline")
    raise ProviderError("no offer gave a usable instance:\n  " + "\n  ".join(errors),
                        hint="try again later, another --gpu, or another provider")


def _give_back(ctx: JobContext, note: str) -> None:
    """An offer that failed: its instance destroyed (confirmed, or said), its connection closed."""
    claim = ctx.claim
    if claim is None:
        return
    if claim.transport is not None:
        with contextlib.suppress(Exception):
            claim.transport.close()
    destroy_claim(ctx, claim, note, False, False)
    ctx.claim = None


def _job_key(ctx: JobContext) -> tuple[Path | None, str]:
    """The SSH key of this job: the user's ``--identity``; none on a borrowed host (your usual keys
    and agent apply, no -i); else a fresh ed25519 pair for this job only."""
    if ctx.opts.identity is not None:
        identity = Path(ctx.opts.identity).expanduser()
        return identity, public_key(identity)
    if ctx.provider.traits.borrowed:
        return None, ""
    identity = ephemeral_key(job_key_dir(ctx.job_id), f"lorapod-{ctx.job_id}")
    ctx.say("made a fresh ed25519 key pair for this job")
    return identity, public_key(identity)


def _create(ctx: JobContext, offer: Offer, identity: Path | None, pub: str) -> tuple[Claim, Instance]:
    """Create, with the ledger row written first. Never blindly retried: when the provider's
    answer is uncertain (timeout, 5xx, Ctrl-C), the instance is looked up by its label first."""
    o, ledger = ctx.opts, ctx.ledger
    # Invariant 1: the row exists before create() returns to any of our code.
    ledger_id = ledger.instance_creating(ctx.provider.name, ctx.job_id, offer.usd_per_hour, offer.gpu_name,
                                         offer.to_dict())
    ledger.job_update(ctx.job_id, instance_id=ledger_id)
    ledger.instance_access(ledger_id, {"target": ctx.target, "identity": str(identity) if identity else None})
    claim = ctx.claim = Claim(ledger_id, instance_label(ledger_id, ctx.job_id), offer, identity)
    spec = InstanceSpec(label=ctx.job_id, ssh_public_key=pub, disk_gb=ctx.spec.compute.disk_gb,
                        name=claim.label, image=ctx.spec.compute.image)
    tier = " (spot: interruptible, bid)" if offer.extra.get("interruptible") else ""
    if ctx.provider.traits.borrowed:  # a machine that exists: its GPU is whatever it has, read once it answers
        planned = f" (planned as {offer.gpu_name}, compute.gpu)" if offer.gpu_name != "this host" else ""
        ctx.say(f"using the {ctx.provider.name} host {offer.id}{planned} at ${offer.usd_per_hour:.3f}/h")
    else:
        ctx.say(f"creating {offer.gpu_name} on {ctx.provider.name} at ${offer.usd_per_hour:.3f}/h{tier}")
    claim.created_at_mono = time.monotonic()
    for attempt in range(1, o.create_attempts + 1):
        try:
            return claim, _created(ctx, claim, ctx.provider.create(offer, spec))
        except CreatedButUnusable as exc:
            _created(ctx, claim, exc.instance)  # recorded: teardown destroys it with confirmation
            raise
        except Interrupted:
            found = _look_up(ctx, claim)
            if found is not None:
                _created(ctx, claim, found)
            raise  # not found: the row stays 'creating'; teardown looks again
        except ApiError as exc:
            if not exc.uncertain:
                _refused(ctx, claim, exc)
                raise
            ctx.say(f"create did not answer clearly ({exc.message}); looking for the instance by its label")
            found = _look_up(ctx, claim)
            if found is not None:
                return claim, _created(ctx, claim, found)
            if attempt == o.create_attempts:
                raise
            ctx.say(f"no instance labelled {claim.label}: creating again ({attempt + 1}/{o.create_attempts})")
        except LorapodError as exc:
            _refused(ctx, claim, exc)
            raise
    raise AssertionError("unreachable: the last attempt returns or raises")


def _look_up(ctx: JobContext, claim: Claim) -> Instance | None:
    if ctx.provider.traits.borrowed:  # a host's "instance" is only a name: nothing to look for
        return None
    return find_by_label(ctx.provider, claim.label, ctx.opts.create_settle_s, ctx.say)[0]


def _created(ctx: JobContext, claim: Claim, inst: Instance) -> Instance:
    claim.instance = inst
    ctx.ledger.instance_created(claim.ledger_id, inst.id, inst.usd_per_hour or claim.offer.usd_per_hour)
    return inst


def _refused(ctx: JobContext, claim: Claim, exc: LorapodError) -> None:
    ctx.ledger.instance_create_failed(claim.ledger_id, exc.message)
    ctx.claim = None


def wait_ready(ctx: JobContext, claim: Claim, inst: Instance, estimate: OfferEstimate | None = None) -> Lease:
    """Boot, then SSH, under one deadline (``ready_deadline_s``), extended by at most
    ``pull_extension_s`` while the provider reports an image pull; a progress line every
    ``progress_every_s`` says what the wait has cost. Once SSH answers, "Permission denied" is
    retried for ``auth_grace_s`` (Vast.ai's key arrives late); a first route that stays silent
    for ``direct_ssh_s`` gives way to the next (Vast.ai: direct, then its proxy)."""
    o, provider = ctx.opts, ctx.provider
    start = time.monotonic()
    limit = {"deadline": start + o.ready_deadline_s, "most": start + o.ready_deadline_s + o.pull_extension_s}
    hint = "the provider may be short of capacity; lorapod destroys it and tries the next offer"
    last_note = [start]

    def progress(what: str) -> None:
        now = time.monotonic()
        if now - last_note[0] >= o.progress_every_s:
            last_note[0] = now
            usd = ctx.ledger.usd(ctx.job_id)
            ctx.say(f"still waiting for {what} after {now - start:.0f} s (${usd:.3f} so far; gives up after "
                    f"{limit['deadline'] - start:.0f} s)")

    seen = [inst]  # the instance as last refreshed (its SSH route may change below)

    def ready() -> bool:
        now = seen[0] = claim.instance = provider.refresh(seen[0])
        if now.state in ("error", "exited", "gone"):
            raise ProviderError(f"instance {now.id} is {now.state}: {now.message or ''}")
        if now.pulling and limit["deadline"] < limit["most"]:
            # the provider says the image is still coming: keep its time, within the extension
            limit["deadline"] = min(limit["most"], max(limit["deadline"], time.monotonic() + 60.0))
        if not now.ssh_ready:
            progress("the image pull" if now.pulling else f"instance {now.id} to boot")
        return now.ssh_ready

    backoff_until(ready, limit, f"instance {inst.id} to boot", hint, most=10)
    ctx.phase("boot", time.monotonic() - claim.created_at_mono)
    booted_inst = seen[0]
    _bill_at_the_providers_price(ctx, claim.ledger_id, booted_inst)
    routes = [(booted_inst.ssh_host or "", booted_inst.ssh_port), *booted_inst.ssh_alternates]
    conn = [transport_for(provider, booted_inst, claim.identity, claim.ledger_id)]
    claim.transport = conn[0]
    booted = time.monotonic()
    state = _Routes(since=booted)

    def ssh_answers() -> bool:
        transport, now_inst = conn[0], seen[0]
        try:
            transport.run("true", timeout=max(2.0, min(15.0, limit["deadline"] - time.monotonic())))
            return True
        except AuthRefused:
            # sshd answered but does not know the key yet: wait for it, for a bounded time
            now = time.monotonic()
            state.auth_since = state.auth_since or now
            # only where the provider installs the key after the instance starts (a trait it
            # declares); elsewhere a refused key is the user's to fix, said at once
            if not provider.traits.key_arrives_late or now - state.auth_since > o.auth_grace_s:
                raise
            progress("the instance to accept the job's SSH key")
            return False
        except ConnectionLost:
            now = time.monotonic()
            if state.route + 1 < len(routes) and now - state.since >= o.direct_ssh_s:
                state.route += 1
                state.since = now
                host, port = routes[state.route]
                ctx.say(f"SSH on {now_inst.ssh_host}:{now_inst.ssh_port} does not answer; trying {host}:{port}")
                now_inst = seen[0] = claim.instance = now_inst.with_(ssh_host=host, ssh_port=port)
                with contextlib.suppress(Exception):
                    transport.close()
                conn[0] = claim.transport = transport_for(provider, now_inst, claim.identity, claim.ledger_id)
            progress(f"SSH on {now_inst.ssh_host}:{now_inst.ssh_port}")
            return False

    backoff_until(ssh_answers, limit, f"SSH on {booted_inst.ssh_host}:{booted_inst.ssh_port}", hint, most=5)
    ready_inst, transport = seen[0], conn[0]
    ctx.phase("ssh ready", time.monotonic() - booted)
    ctx.ledger.instance_ready(claim.ledger_id, ready_inst.ssh_host or "", ready_inst.ssh_port, ready_inst.ssh_user)
    ctx.say(f"instance {ready_inst.id} answers on {ready_inst.ssh_user}@{ready_inst.ssh_host}:{ready_inst.ssh_port}")
    return Lease(claim.ledger_id, ready_inst.id, ready_inst, claim.offer, claim.label, claim.identity, transport,
                 claim.created_at_mono, estimate)


@dataclass
class _Routes:
    """Where the SSH wait is: the route tried (its index), since when, and since when the key was refused."""

    since: float
    route: int = 0
    auth_since: float | None = None


def _bill_at_the_providers_price(ctx: JobContext, ledger_id: str, inst: Instance) -> None:
    """Money is counted at the provider's price for this instance (invariant 4): when the
    running instance reports another $/h than the offer said (Vast.ai prices a search for the
    storage it names), the ledger, and with it the caps and the watchdog, take the instance's."""
    row = ctx.ledger.instance(ledger_id)
    billed = inst.usd_per_hour
    if row is None or not billed or abs(billed - row.usd_per_hour) <= 0.005 * max(billed, row.usd_per_hour):
        return
    ctx.ledger.instance_created(ledger_id, inst.id, billed)
    ctx.say(f"{ctx.provider.name} bills ${billed:.4f}/h for instance {inst.id}, not the offered "
            f"${row.usd_per_hour:.4f}/h; the caps count the billed price")


def transport_for(provider: Provider, inst: Instance, identity: Path | None, ledger_id: str) -> Transport:
    """SSH to the instance with a known_hosts file of its own (host key pinned on first use),
    unless the provider brings its own transport (local shell, or an SSH host's shared pin)."""
    from lorapod.home import lorapod_home

    known = lorapod_home() / "known_hosts" / ledger_id
    own = provider.transport(inst, identity, known)
    if own is not None:
        return own
    return SSHTransport(inst.ssh_host or "", inst.ssh_port, inst.ssh_user, identity, known)
