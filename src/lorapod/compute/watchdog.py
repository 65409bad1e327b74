"""The on-instance watchdog: destroys the instance from inside when nobody else will.

It is started, detached, before training, and needs nothing but the Python standard library
(the controller uploads this very file), so it works before and whatever lorapod's own
environment does. It reads ``watchdog.json`` (no secrets) in its work folder and checks, every
``poll_s`` seconds:

* the job ended and the controller wrote ``PULLED`` (results are home) -> destroy now;
* the job ended and the controller is silent (``HEARTBEAT`` older than ``heartbeat_timeout_s``)
  -> destroy; the job ended and ``done_grace_s`` passed without ``PULLED`` -> destroy;
* no new step (``run/metrics.jsonl`` unchanged) for ``stall_s`` -> write ``run/STOP`` so the
  trainer saves a checkpoint and exits, wait ``stop_wait_s``, kill it; then the rules above;
* the dollar or hour cap is ``cap_margin_s`` away -> ``run/STOP``; the cap itself -> kill the
  job and destroy, whatever else is going on.

"Destroy" depends on the provider: RunPod ``DELETE /pods/{RUNPOD_POD_ID}`` with the pod-scoped
``RUNPOD_API_KEY``; Vast.ai ``DELETE /api/v0/instances/{CONTAINER_ID}/`` with
``CONTAINER_API_KEY`` (both read from this process's environment, then from PID 1's, because
SSH sessions do not always inherit the container's variables); on an SSH host or locally, stop
the job and delete the work folder, never the machine. The provider's base URL can be
overridden (``api_url`` in the config), which is how tests point it at local fakes.

Run: ``python3 watchdog.py`` with the work folder as current directory.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
import urllib.error
import urllib.request
from typing import Any

DEFAULTS: dict[str, Any] = {
    "provider": "ssh",
    "instance_id": None,
    "api_url": None,
    "elapsed_at_start_s": 0.0,
    "usd_per_hour": 0.0,
    "max_usd": None,
    "max_hours": None,
    "heartbeat_timeout_s": 600.0,
    "done_grace_s": 1800.0,
    "stall_s": 1800.0,
    "stop_wait_s": 300.0,
    "cap_margin_s": 120.0,
    "poll_s": 10.0,
}


def log(msg: str) -> None:
    sys.stdout.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} watchdog: {msg}\n")
    sys.stdout.flush()


def mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def job_pid() -> int | None:
    try:
        with open("job.pid") as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is not alive for our purpose.
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def cap_seconds(cfg: dict[str, Any]) -> float | None:
    """Seconds since the instance was created at which a cap is crossed (None: no cap)."""
    caps = []
    if cfg.get("max_hours"):
        caps.append(float(cfg["max_hours"]) * 3600.0)
    if cfg.get("max_usd") and float(cfg.get("usd_per_hour") or 0) > 0:
        caps.append(float(cfg["max_usd"]) / float(cfg["usd_per_hour"]) * 3600.0)
    return min(caps) if caps else None


def decide(cfg: dict[str, Any], now: float, started: float, facts: dict[str, Any]) -> str:
    """Pure decision for one tick: 'destroy', 'stop' (write STOP), 'kill' or 'wait'.

    ``facts``: job_started (bool), job_done (bool), done_at, pulled (bool), heartbeat (mtime),
    progress (mtime of metrics.jsonl or job start), stop_written_at.
    """
    elapsed = float(cfg["elapsed_at_start_s"]) + (now - started)
    cap = cap_seconds(cfg)
    if cap is not None and elapsed >= cap:
        return "destroy"
    if facts["job_done"]:
        if facts["pulled"]:
            return "destroy"
        hb = facts["heartbeat"] or started
        if now - hb > float(cfg["heartbeat_timeout_s"]):
            return "destroy"
        if now - (facts["done_at"] or now) > float(cfg["done_grace_s"]):
            return "destroy"
        return "wait"
    if not facts["job_started"]:
        hb = facts["heartbeat"] or started
        # Never started and the controller is gone: nothing will ever start it.
        return "destroy" if now - hb > float(cfg["heartbeat_timeout_s"]) else "wait"
    stop_at = facts["stop_written_at"]
    if stop_at is not None and now - stop_at > float(cfg["stop_wait_s"]):
        return "kill"
    if stop_at is None:
        if cap is not None and elapsed >= cap - float(cfg["cap_margin_s"]):
            return "stop"
        progress = facts["progress"] or started
        if now - progress > float(cfg["stall_s"]):
            return "stop"
    return "wait"


def gather(run_dir: str = "run") -> dict[str, Any]:
    pid = job_pid()
    done_at = mtime("job.exit")
    running = alive(pid)
    return {
        "job_started": pid is not None,
        "job_done": done_at is not None or (pid is not None and not running),
        "done_at": done_at,
        "pulled": os.path.exists("PULLED"),
        "heartbeat": mtime("HEARTBEAT"),
        "progress": mtime(os.path.join(run_dir, "metrics.jsonl")) or mtime("job.pid"),
        "stop_written_at": mtime(os.path.join(run_dir, "STOP")),
    }


def kill_job(reason: str) -> None:
    pid = job_pid()
    if pid and alive(pid):
        log(f"stopping the job (process group {pid}): {reason}")
        for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pid, sig)
            except (ProcessLookupError, PermissionError):
                break
            end = time.time() + wait
            while time.time() < end and alive(pid):
                time.sleep(0.2)
            if not alive(pid):
                break
    if not os.path.exists("job.exit"):
        with open("job.exit.tmp", "w") as fh:
            fh.write(f"killed: {reason}\n")
        os.replace("job.exit.tmp", "job.exit")


def instance_env(name: str) -> str | None:
    """A variable from our environment, else from PID 1's (the container's own)."""
    if os.environ.get(name):
        return os.environ[name]
    try:
        with open("/proc/1/environ", "rb") as fh:
            for item in fh.read().split(b"\0"):
                key, _, value = item.partition(b"=")
                if key.decode(errors="replace") == name and value:
                    return value.decode()
    except OSError:
        pass
    return None


def http_delete(url: str, token: str, timeout: float = 20.0) -> int:
    req = urllib.request.Request(url, method="DELETE", headers={"Authorization": f"Bearer {token}",
                                                               "Accept": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def destroy_through_api(cfg: dict[str, Any]) -> bool:
    """Ask the provider to delete this instance; True once it is gone (404 counts as gone)."""
    provider = cfg["provider"]
    if provider == "runpod":
        pod = instance_env("RUNPOD_POD_ID") or cfg.get("instance_id")
        key = instance_env("RUNPOD_API_KEY")
        base = (cfg.get("api_url") or "https://rest.runpod.io/v1").rstrip("/")
        url = f"{base}/pods/{pod}"
    elif provider == "vast":
        pod = instance_env("CONTAINER_ID") or cfg.get("instance_id")
        key = instance_env("CONTAINER_API_KEY")
        base = (cfg.get("api_url") or "https://console.vast.ai").rstrip("/")
        url = f"{base}/api/v0/instances/{pod}/"
    else:
        raise ValueError(provider)
    if not key or not pod:
        log(f"cannot destroy through the {provider} API: no instance id or scoped key in the environment")
        return False
    delay = 2.0
    for _ in range(8):
        try:
            status = http_delete(url, key)
        except (urllib.error.URLError, OSError) as exc:
            log(f"DELETE failed ({exc}); retrying in {delay:.0f} s")
            status = 0
        if status in (200, 202, 204, 404):
            log(f"{provider} confirmed the delete (HTTP {status})")
            return True
        if status in (401, 403):
            log(f"{provider} refused the scoped key (HTTP {status})")
            return False
        time.sleep(delay)
        delay = min(60.0, delay * 2)
    return False


def destroy(cfg: dict[str, Any], reason: str) -> bool:
    log(f"destroying: {reason}")
    kill_job(reason)
    if cfg["provider"] in ("runpod", "vast"):
        return destroy_through_api(cfg)
    # ssh / local: the machine is not ours; remove only our work folder.
    here = os.getcwd()
    os.chdir("/")
    shutil.rmtree(here, ignore_errors=True)
    return True


def write_stop(reason: str, run_dir: str = "run") -> None:
    log(f"asking the job to checkpoint and stop ({reason})")
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "STOP"), "w") as fh:
        fh.write(reason + "\n")


def main() -> int:
    with open("watchdog.json") as fh:
        cfg = {**DEFAULTS, **json.load(fh)}
    with open("watchdog.pid.tmp", "w") as fh:
        fh.write(str(os.getpid()))
    os.replace("watchdog.pid.tmp", "watchdog.pid")
    started = time.time()
    log(f"watching (provider {cfg['provider']}, cap {cap_seconds(cfg)} s, poll {cfg['poll_s']} s)")
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    failures = 0
    while True:
        now = time.time()
        facts = gather()
        action = decide(cfg, now, started, facts)
        if action == "destroy":
            why = ("the job ended and its results were pulled" if facts["job_done"] and facts["pulled"]
                   else "a cap, a silent controller or the grace period")
            if destroy(cfg, why):
                return 0
            failures += 1
            if failures > 20:
                log("giving up: the instance could not be destroyed from inside; `lorapod down --orphans` will")
                return 1
        elif action == "stop":
            cap = cap_seconds(cfg)
            elapsed = float(cfg["elapsed_at_start_s"]) + (now - started)
            write_stop("budget or time cap is near" if cap is not None and elapsed >= cap - float(cfg["cap_margin_s"])
                       else f"no progress for {cfg['stall_s']:.0f} s")
        elif action == "kill":
            kill_job("did not stop after STOP")
        time.sleep(float(cfg["poll_s"]))


if __name__ == "__main__":
    sys.exit(main())
