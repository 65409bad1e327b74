"""``lorapod doctor runpod|vast``: the live check a user runs once with their own key.

The tests model each provider from its official client and documents (tests/fakes); what only a
real account can settle (review cloud-2026-12-01, section D) is checked here, on one instance of
the cheapest GPU in stock, for at most :data:`MAX_MINUTES` minutes:

``offer`` the cheapest in-stock offer and its price -> ``create`` -> ``ssh + key`` (how long the
key took to work) -> ``rsync`` and ``python`` (what an SSH session finds, and PID 1's PATH) ->
``scoped key`` (the provider's in-instance variables: in the session, in PID 1's environment, in
the onstart file; presence only, never values) -> ``price`` (what the provider reports for the
instance against what it offered) -> ``self-destroy`` (the provider's watchdog recipe, run on the
instance with the scoped key) -> ``gone`` (the provider's GET after it).

``--spot`` rents the cheapest interruptible offer instead, at its bid, and adds ``bid`` (the
provider accepted the bid: the instance is interruptible and bills at most the bid) and, on RunPod,
``sigterm path`` (the pod's PID 1 is lorapod's init, which passes a preemption's SIGTERM on to the
job: compute/remote.py SPOT_INIT); Vast.ai documents no signal, so there is nothing to check
there. The rest is the same: the instance destroys itself with the scoped key.

Whatever happens, the instance is destroyed with the account key if the scoped key did not do it,
and confirmed; it is in the ledger before the create call, like any other, and once Python is
found it runs a job's watchdog, capped at the doctor's minutes and fed by a heartbeat, so a doctor
killed outright still leaves nothing billing past them. A run that did not finish every check
(interrupted, or stopped by an exception) is never recorded as a pass. The report is stored in
the ledger (event ``doctor``), and ``lorapod run`` warns while a provider has never passed.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lorapod.compute.context import bounded
from lorapod.compute.deadman import describe as describe_switch
from lorapod.compute.provider import (
    DoctorFacts,
    Instance,
    InstanceSpec,
    Offer,
    Provider,
    Requirements,
    doctor_facts,
    rank_offers,
)
from lorapod.errors import LorapodError, ProviderError
from lorapod.home import lorapod_home
from lorapod.store.identity import instance_label
from lorapod.store.ledger import Ledger

MAX_MINUTES = 10.0
DOCTOR_JOB = "doctor"
#: The checks a doctor run makes, in order; it passed only when every one ran and held (a run that
#: was interrupted, or stopped at an earlier failure, never records a pass). ``cleanup`` may follow.
CHECKS = ("offer", "create", "ssh + key", "rsync", "python", "scoped key", "price", "self-destroy", "gone")
#: the mark of lorapod's spot init in PID 1's command line (compute/remote.py spot_init_args)
INIT_MARK = ".lorapod-init.sh"
#: The doctor's instance gets a job's watchdog (compute/watchdog.py) with these, and its cap: the
#: doctor's own minutes from the create. A doctor killed (SIGKILL, a closed laptop) stops the
#: heartbeat, and the watchdog destroys the instance from inside.
WATCHDOG = {"heartbeat_timeout_s": 120.0, "poll_s": 2.0, "cap_margin_s": 0.0, "stop_wait_s": 0.0}
#: interpreters the official images have (catalog/images.py) and the usual names
PYTHONS = ("python3", "python", "/usr/local/bin/python", "/venv/main/bin/python", "/opt/conda/bin/python")


@dataclass
class Check:
    name: str
    ok: bool | None  # None: not run (an earlier step failed)
    evidence: str


@dataclass
class Report:
    provider: str
    cap_usd: float
    checks: list[Check] = field(default_factory=list)
    started_at: float = field(default_factory=time.time)
    spot: bool = False
    #: what ``--spot`` checks besides on this provider (its class's ``DoctorFacts.spot_checks``)
    spot_checks: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        names = [c.name for c in self.checks]
        need = CHECKS + (self.spot_checks if self.spot else ())
        return all(n in names for n in need) and all(c.ok for c in self.checks)

    def add(self, name: str, ok: bool | None, evidence: str) -> Check:
        c = Check(name, ok, evidence[:300])
        self.checks.append(c)
        return c

    def to_dict(self) -> dict[str, Any]:
        return {"provider": self.provider, "cap_usd": round(self.cap_usd, 4), "passed": self.passed,
                "spot": self.spot, "started_at": self.started_at, "checks": [asdict(c) for c in self.checks]}


def cheapest_offer(provider: Provider, disk_gb: float = 20.0, spot: bool = False,
                   max_bid_per_gpu_hour: float | None = None) -> Offer:
    """The cheapest offer the provider lists as rentable now (in stock, an image-compatible host);
    ``spot``: the cheapest interruptible one, at its bid (at most ``max_bid_per_gpu_hour``, a
    finite bid: ``--max-bid nan`` once read as no ceiling at all)."""
    if max_bid_per_gpu_hour is not None:
        bounded("--max-bid", max_bid_per_gpu_hour, 1e-6, 1000.0)
    req = Requirements(disk_gb=disk_gb, interruptible=spot, max_bid_per_gpu_hour=max_bid_per_gpu_hour)
    offers = rank_offers(provider.offers(req), req)
    if not offers:
        what = "spot (interruptible) offer within the bid ceiling" if spot else "offer"
        raise ProviderError(f"{provider.name} has no {what} in stock right now", hint="try again in a few minutes")
    return offers[0]


def cap_usd(offer: Offer, minutes: float = MAX_MINUTES) -> float:
    return offer.usd_per_hour * minutes / 60.0


def last_report(ledger: Ledger, provider: str) -> dict[str, Any] | None:
    """The newest doctor report for ``provider`` in this installation's ledger."""
    for ev in reversed(ledger.events()):
        if ev.get("kind") != "doctor":
            continue
        try:
            rep = json.loads(ev.get("message") or "")
        except ValueError:
            continue
        if isinstance(rep, dict) and rep.get("provider") == provider:
            return rep
    return None


def ever_passed(ledger: Ledger, provider: str) -> bool:
    for ev in ledger.events():
        if ev.get("kind") == "doctor":
            try:
                rep = json.loads(ev.get("message") or "")
            except ValueError:
                continue
            if isinstance(rep, dict) and rep.get("provider") == provider and rep.get("passed"):
                return True
    return False


def doctor_note(ledger: Ledger, provider: str) -> str | None:
    """What ``lorapod run`` says before renting from a provider ``doctor`` never passed here."""
    if doctor_facts(provider) is None or ever_passed(ledger, provider):
        return None
    last = last_report(ledger, provider)
    failed = [c["name"] for c in (last or {}).get("checks", []) if not c.get("ok")]
    return (f"{provider} has never passed `lorapod doctor {provider}` on this installation"
            + (f" (the last run failed: {', '.join(failed)})" if failed else "")
            + f"; it checks, for cents, what the tests cannot: `lorapod doctor {provider} --yes`")


def run_doctor(provider: Provider, offer: Offer, ledger: Ledger | None = None, say: Callable[[str], None] = print,
               minutes: float = MAX_MINUTES, transport_factory: Callable[..., Any] | None = None,
               poll_s: float = 2.0, deadman_min: float | None = None) -> Report:
    """Create one instance from ``offer``, check it, destroy it from inside, confirm; never longer
    than ``minutes`` before the destroy begins. The instance carries a dead man's switch
    (compute/deadman.py) of ``deadman_min`` (default: the plan's for the provider, at most the
    doctor's ``minutes``), disarmed once its watchdog runs: a doctor killed before its instance
    answers SSH leaves nothing billing after it."""
    from lorapod.compute.acquire import transport_for
    from lorapod.compute.deadman import DeadMan
    from lorapod.compute.provider import capability
    from lorapod.compute.transport import AuthRefused, ConnectionLost, ephemeral_key, public_key
    from lorapod.plan.cost import default_deadman_minutes

    ledger = ledger or Ledger()
    spot = offer.interruptible
    facts = doctor_facts(provider.name) or DoctorFacts()  # what its class says its instances get
    report = Report(provider.name, cap_usd(offer, minutes), spot=spot, spot_checks=facts.spot_checks)
    report.add("offer", True, f"{offer.gpu_name} ({offer.id}) at ${offer.usd_per_hour:.3f}/h"
               + (f", a bid of ${offer.bid_per_gpu_hour or 0:.3f}/GPU-h"
                  if spot else ""))
    deadline = time.monotonic() + minutes * 60.0
    job_id = f"{DOCTOR_JOB}-{provider.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    key_dir = lorapod_home() / "keys" / job_id
    identity = ephemeral_key(key_dir, "lorapod-doctor")
    # a job row with this process as its controller: `ps` shows what bills, `down --orphans`
    # spares it while this process lives and destroys it if it dies
    ledger.job_started(job_id, str(lorapod_home() / DOCTOR_JOB), provider.name, provider.name, None,
                       report.cap_usd, minutes / 60.0)
    ledger.job_update(job_id, state="running")
    ledger_id = ledger.instance_creating(provider.name, job_id, offer.usd_per_hour, offer.gpu_name, offer.to_dict())
    ledger.job_update(job_id, instance_id=ledger_id)
    label = instance_label(ledger_id, job_id)
    inst: Instance | None = None
    destroyed = False
    finished = False
    heartbeat = None
    created_at = time.monotonic()
    if deadman_min is None:
        deadman_min = min(minutes, default_deadman_minutes(provider.name))
    deadman = (DeadMan(deadman_min * 60.0) if deadman_min > 0 and capability(provider, "deadman").supported
               else None)
    try:
        try:
            inst = provider.create(offer, InstanceSpec(label=job_id, ssh_public_key=public_key(identity),
                                                       disk_gb=20.0, name=label, deadman=deadman))
        except LorapodError as exc:
            ledger.instance_create_failed(ledger_id, exc.message)
            report.add("create", False, exc.message)
            return report
        ledger.instance_created(ledger_id, inst.id, inst.usd_per_hour or offer.usd_per_hour)
        report.add("create", True, f"instance {inst.id}")
        if spot:  # the bid was taken: the provider rented an interruptible instance at it
            report.add("bid", inst.interruptible and (inst.usd_per_hour or 0) <= offer.usd_per_hour * 1.01 + 1e-9,
                       f"{'interruptible' if inst.interruptible else 'NOT interruptible'}, "
                       f"${inst.usd_per_hour or 0:.4f}/h against the bid's ${offer.usd_per_hour:.4f}/h")
        say(f"created {inst.id}; waiting for it (at most {minutes:g} min in all)")
        t0 = time.monotonic()
        while not inst.ssh_ready:
            if time.monotonic() > deadline:
                report.add("ssh + key", False, f"not running after {time.monotonic() - t0:.0f} s ({inst.message or inst.state})")
                return report
            time.sleep(poll_s)
            inst = provider.refresh(inst)
            if inst.state in ("error", "exited", "gone"):
                report.add("ssh + key", False, f"instance {inst.state}: {inst.message or ''}")
                return report
        booted = time.monotonic()
        routes = [(inst.ssh_host or "", inst.ssh_port), *inst.ssh_alternates]
        make = transport_factory or transport_for
        first_auth_refusal: float | None = None
        route = 0
        host, port = routes[0]
        t = make(provider, inst.with_(ssh_host=host, ssh_port=port), identity, ledger_id)
        while True:
            try:
                t.run("true", timeout=15)
                break
            except AuthRefused:
                first_auth_refusal = first_auth_refusal or time.monotonic()
            except ConnectionLost:
                if route + 1 < len(routes) and time.monotonic() - booted > 60:
                    route += 1
                    host, port = routes[route]
                    t.close()
                    t = make(provider, inst.with_(ssh_host=host, ssh_port=port), identity, ledger_id)
            if time.monotonic() > deadline:
                report.add("ssh + key", False, f"no SSH on {host}:{port} within the doctor's {minutes:g} min")
                return report
            time.sleep(poll_s)
        key_wait = (f"; the key was refused for {time.monotonic() - first_auth_refusal:.0f} s before it worked"
                    if first_auth_refusal else "")
        report.add("ssh + key", True, f"root@{host}:{port} after {time.monotonic() - t0:.0f} s"
                   + (" (the proxy: the direct route did not answer)" if route else "") + key_wait)
        ledger.instance_ready(ledger_id, host, port, "root")
        found = _probe(t, facts.scoped)
        report.add("rsync", bool(found.get("rsync")), found.get("rsync") or "not on the SSH session's PATH")
        py = found.get("python")
        report.add("python", bool(py), (f"{py} (Python {found.get('python_version', '?')})" if py else
                                       "no interpreter found") + f"; PID 1's PATH: {found.get('pid1_path') or '?'}")
        if py:  # the watchdog a job gets, before the checks that may hang
            heartbeat = _start_watchdog(t, provider, inst, job_id, py, minutes, offer, time.monotonic() - created_at,
                                        say)
        if deadman is not None:  # the start command armed it: evidence that it runs, then disarmed
            if heartbeat is not None:
                out = t.run(deadman.disarm(), timeout=30, check=False).stdout.decode(errors="replace")
                report.add("dead man's switch", out.startswith("LPSW disarmed"), describe_switch(out, deadman))
            else:
                report.add("dead man's switch", None, f"left armed ({deadman_min:g} min): no watchdog runs here")
        if spot and "sigterm path" in facts.spot_checks:
            cmd = found.get("pid1_cmd") or ""
            report.add("sigterm path", INIT_MARK in cmd,
                       "PID 1 is lorapod's init: a preemption's SIGTERM reaches the job" if INIT_MARK in cmd else
                       f"PID 1 is {cmd[:120] or '?'}, not lorapod's init: a preemption's SIGTERM would not reach "
                       "the job (an image whose start command lorapod does not know: catalog/images.py)")
        names = facts.scoped
        seen = found.get("scoped", {})
        report.add("scoped key", all(seen.get(n) for n in names),
                   ", ".join(f"{n}: {seen.get(n) or 'missing'}" for n in names))
        inst = provider.refresh(inst)
        billed = inst.usd_per_hour
        report.add("price", bool(billed) and billed <= offer.usd_per_hour * 1.01 + 1e-9,
                   f"offered ${offer.usd_per_hour:.4f}/h, the provider reports ${billed:.4f}/h for the instance")
        if _self_destroy(t, provider, inst, py, report):
            destroyed = _wait_gone(provider, inst, 60.0, poll_s)
            report.add("gone", destroyed, "the provider's GET says the instance no longer exists" if destroyed
                       else "the provider still lists the instance 60 s after the destroy")
            if destroyed:
                ledger.instance_destroyed(ledger_id, "doctor: destroyed from inside")
        finished = True
        return report
    finally:
        if heartbeat is not None:
            heartbeat.set()
        if not finished and not any(c.ok is False for c in report.checks):
            # an exception or Ctrl-C: what did not run did not pass (before: recorded as passed)
            report.add("finished", False, "interrupted before every check ran")
        if inst is not None and not destroyed:
            _destroy_with_account_key(provider, inst, ledger, ledger_id, report, poll_s)
        for f in key_dir.glob("id_ed25519*"):
            f.unlink(missing_ok=True)
        ledger.job_ended(job_id, "done" if report.passed else "failed",
                         "doctor passed" if report.passed else "doctor failed: " + ", ".join(
                             c.name for c in report.checks if c.ok is False))
        ledger.event("doctor", json.dumps(report.to_dict()), job_id=job_id, instance_id=ledger_id)


def _start_watchdog(t: Any, provider: Provider, inst: Instance, job_id: str, python: str, minutes: float,
                    offer: Offer, since_create_s: float, say: Callable[[str], None]) -> Any:
    """Start lorapod's watchdog on the doctor's instance, as a job's is started
    (:meth:`RemoteWork.start_watchdog`), capped at the doctor's ``minutes`` counted from the create,
    with a heartbeat from this process; returns the heartbeat's stop event (None when it could not
    start: the run goes on, the account key still destroys it, and the report says so)."""
    from lorapod.compute.provision import _start_heartbeat
    from lorapod.compute.remote import RemoteWork

    work = RemoteWork(t, job_id)
    cfg = {**provider.watchdog_config(inst), **WATCHDOG, "max_hours": minutes / 60.0,
           "usd_per_hour": inst.usd_per_hour or offer.usd_per_hour, "elapsed_at_start_s": max(0.0, since_create_s)}
    try:
        work.start_watchdog(cfg, python)
        pid = work.watchdog_alive()
    except LorapodError as exc:
        say(f"the watchdog did not start on the instance: {exc.message}")
        return None
    say(f"watchdog started on the instance (pid {pid}): it destroys it after {minutes:g} min, or "
        f"{WATCHDOG['heartbeat_timeout_s']:.0f} s after this process stops")
    return _start_heartbeat(work, WATCHDOG["heartbeat_timeout_s"])


def _probe(t: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """One shell round trip: tools, interpreters and the presence of the scoped variables ``names``."""
    # env values are never printed: only "session", "pid1" or "file" for each name
    checks = " ".join(
        f"s=; env | grep -q '^{n}=' && s=session; "
        f"[ -z \"$s\" ] && tr '\\0' '\\n' < /proc/1/environ 2>/dev/null | grep -q '^{n}=' && s=pid1; "
        f"[ -z \"$s\" ] && grep -qs '^{n}=' /root/.lorapod-instance.env && s=file; echo \"scoped {n} $s\";"
        for n in names)
    pys = " ".join(shlex.quote(p) for p in PYTHONS)
    script = (
        "echo \"rsync $(command -v rsync)\"; "
        f"for p in {pys}; do q=$(command -v \"$p\" 2>/dev/null) || continue; "
        "v=$(\"$q\" -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])' 2>/dev/null) || continue; "
        "echo \"python $q $v\"; break; done; "
        "echo \"pid1path $(tr '\\0' '\\n' < /proc/1/environ 2>/dev/null | grep '^PATH=' | cut -c6- | head -c 400)\"; "
        # PID 1's command line (LORAPOD_PID1_CMDLINE: only lorapod's loopback test hosts set it)
        "echo \"pid1cmd $(tr '\\0' ' ' < \"${LORAPOD_PID1_CMDLINE:-/proc/1/cmdline}\" 2>/dev/null | head -c 400)\"; "
        + checks)
    try:
        out = t.run(script, timeout=60, check=False).stdout.decode(errors="replace")
    except LorapodError as exc:
        return {"error": exc.message}
    facts: dict[str, Any] = {"scoped": {}}
    for line in out.splitlines()[:50]:
        parts = line.strip().split(" ")
        if parts[0] == "rsync" and len(parts) > 1 and parts[1]:
            facts["rsync"] = parts[1][:200]
        elif parts[0] == "python" and len(parts) >= 3:
            facts["python"], facts["python_version"] = parts[1][:200], parts[2][:10]
        elif parts[0] == "pid1path" and len(parts) > 1:
            facts["pid1_path"] = " ".join(parts[1:])[:400]
        elif parts[0] == "pid1cmd" and len(parts) > 1:
            facts["pid1_cmd"] = " ".join(parts[1:])[:400]
        elif parts[0] == "scoped" and len(parts) >= 2 and parts[1] in names:
            facts["scoped"][parts[1]] = parts[2] if len(parts) > 2 and parts[2] in ("session", "pid1", "file") else ""
    return facts


def _self_destroy(t: Any, provider: Provider, inst: Instance, python: str | None, report: Report) -> bool:
    """Upload the watchdog (no rsync needed: ``cat``) and run its destroy recipe on the instance."""
    from lorapod.compute.transport import ConnectionLost

    cfg = provider.watchdog_config(inst)
    recipe = cfg.get("destroy")
    if not python or not isinstance(recipe, dict):
        report.add("self-destroy", False, "no interpreter on the instance" if not python else
                   f"{provider.name} has no self-destroy recipe")
        return False
    wd = (Path(__file__).with_name("watchdog.py")).read_bytes()
    d = f"/tmp/lorapod-doctor-{inst.id}"
    env_file = cfg.get("instance_env_file")
    code = ("import json, sys; sys.path.insert(0, '.'); import watchdog; "
            f"ok = watchdog.run_recipe(json.load(open('recipe.json')), {env_file!r}, 20.0); "
            "print('DOCTOR-RESULT', ok)")
    try:
        t.run(f"mkdir -p {d} && cat > {d}/watchdog.py", input=wd, timeout=60)
        t.run(f"cat > {d}/recipe.json", input=json.dumps(recipe).encode(), timeout=60)
        out = t.run(f"cd {d} && {shlex.quote(python)} -c {shlex.quote(code)} 2>&1", timeout=120, check=False)
        text = out.stdout.decode(errors="replace")
    except ConnectionLost:
        # the instance went away under the command that destroyed it: the expected end
        report.add("self-destroy", True, "the connection closed as the instance was destroyed from inside")
        return True
    except LorapodError as exc:
        report.add("self-destroy", False, exc.message)
        return False
    steps = [ln.split("watchdog: ", 1)[-1] for ln in text.splitlines() if "watchdog: " in ln][:6]
    ok = "DOCTOR-RESULT True" in text
    report.add("self-destroy", ok, "; ".join(steps) or text[-200:])
    return ok


def _wait_gone(provider: Provider, inst: Instance, within_s: float, poll_s: float) -> bool:
    end = time.monotonic() + within_s
    while True:
        try:
            if provider.refresh(inst).state == "gone":
                return True
        except LorapodError:
            pass
        if time.monotonic() > end:
            return False
        time.sleep(poll_s)


def _destroy_with_account_key(provider: Provider, inst: Instance, ledger: Ledger, ledger_id: str, report: Report,
                              poll_s: float) -> None:
    for _ in range(5):
        try:
            provider.destroy(inst.id)
        except LorapodError as exc:
            report.add("cleanup", False, f"destroy with the account key failed: {exc.message}")
            time.sleep(poll_s)
            continue
        if _wait_gone(provider, inst, 60.0, poll_s):
            ledger.instance_destroyed(ledger_id, "doctor: destroyed with the account key")
            report.add("cleanup", True, "destroyed with the account key (the scoped key did not)")
            return
    report.add("cleanup", False, f"instance {inst.id} NOT confirmed destroyed: run `lorapod down --orphans`")
