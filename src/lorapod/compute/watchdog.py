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

It is started as the first thing after SSH answers, before lorapod is even installed there, with
the job's caps (the user's, or a default the controller prints at launch), so a controller that
dies during bootstrap or upload still leaves something that destroys the instance: with no job
yet, a silent controller or a cap is enough. Once it decides to destroy it never gives up while
the instance may bill: failed attempts are retried with backoff up to ``destroy_backoff_max_s``,
each one logged to ``watchdog.log`` (which ``lorapod logs`` shows). No exception (a full disk, a
file the job replaced with a FIFO) ends it: each tick is guarded, and it reads only regular files.

"Destroy" depends on the provider, which writes it into ``watchdog.json`` as a recipe (``destroy``:
steps, an optional ``confirm``, built by the provider's ``api.py``) that :func:`run_recipe`
interprets: RunPod GraphQL ``podTerminate``, ``runpodctl remove pod``, then REST ``DELETE`` with
the pod-scoped ``RUNPOD_API_KEY``; Vast.ai ``DELETE /api/v0/instances/{CONTAINER_ID}/`` with
``CONTAINER_API_KEY``, believed only with ``success: true`` and a GET that answers
``instances: null``. The scoped keys are read from this process's environment, then from PID
1's, because SSH sessions do not inherit the container's variables. On an SSH host or locally:
stop the job and delete the work folder, never the machine. Every request names itself
(``User-Agent``), and what a provider answers is read only up to :data:`MAX_BODY`.

Durations are measured on the monotonic clock: a wall clock stepped back (NTP, a host that sets
it) neither extends a cap nor makes a silent controller look alive. File times (``HEARTBEAT``,
``metrics.jsonl``) are wall-clock ``mtime``s, so each is read once on the wall clock when first
seen and from then on by when it *changed*, on the monotonic clock (:class:`FileClock`).

It is one of two guards that watch each other: it touches ``WATCHDOG_BEAT`` every tick, which the
controller checks on every poll (restarting it when it is gone), and the job's runner
(``guard.sh``, :mod:`lorapod.compute.guards`) restarts it when both it and the controller are
gone. At most one watchdog runs per work folder (an exclusive lock on ``watchdog.lock``).

Run: ``python3 watchdog.py`` with the work folder as current directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import stat
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
    "destroy_backoff_s": 2.0,  # first wait between failed destroy attempts
    "destroy_backoff_max_s": 300.0,  # the ceiling: attempts go on at least this often, forever
    "http_timeout_s": 20.0,
    "instance_env_file": None,  # a root-only file with the provider's scoped variables (Vast.ai)
}


def log(msg: str) -> None:
    """One line to watchdog.log; a full disk loses the line, never the watchdog."""
    try:
        sys.stdout.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} watchdog: {msg}\n")
        sys.stdout.flush()
    except (OSError, ValueError):
        pass


def read_small(path: str, limit: int = 200) -> str | None:
    """The start of a regular file; None for anything else (a FIFO must never block us)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, limit).decode(errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def job_pid() -> int | None:
    text = read_small("job.pid", 32)
    try:
        return int(text.strip()) if text else None
    except ValueError:
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
    """Stop the job's process group (SIGTERM, then SIGKILL) and record why in ``job.exit``. A job
    this stopped is recorded as ``killed:`` even when job.sh wrote the job's own status first
    (job.sh passes SIGTERM on and waits: lorapod's trainer then saves and exits 75), so the
    controller reports the watchdog's reason, not an exit code."""
    pid = job_pid()
    signalled = False
    if pid and alive(pid):
        signalled = True
        log(f"stopping the job (process group {pid}): {reason}")
        # job.sh passes the SIGTERM on and writes the job's own status (143, 75) a moment before
        # the "killed:" line below replaces it; this marker tells the controller's poll that such
        # a status is not the end yet (compute/remote.py RemoteWork.poll)
        try:
            with open("job.killing", "w") as fh:
                fh.write(reason[:200] + "\n")
        except OSError:
            pass
        for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pid, sig)
            except (ProcessLookupError, PermissionError):
                break
            end = time.monotonic() + wait
            while time.monotonic() < end and alive(pid):
                time.sleep(0.2)
            if not alive(pid):
                break
    elif pid:  # the job is over, but its group may outlive it (the runner's guard.sh): end it too
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    if signalled or not os.path.exists("job.exit"):
        # the status job.sh recorded, if any: digits only (the file is the job's to write)
        status = "".join(c for c in (read_small("job.exit", 200) or "").split("\n")[0] if c.isdigit())[:6] \
            if signalled else ""
        try:
            with open("job.exit.tmp", "w") as fh:
                fh.write(f"killed: {reason}" + (f" (the job exited {status})" if status else "") + "\n")
            os.replace("job.exit.tmp", "job.exit")
        except OSError as exc:  # a full disk: the job is stopped all the same
            log(f"could not write job.exit ({exc})")


def instance_env(name: str, env_file: str | None = None) -> str | None:
    """A variable from our environment, else from PID 1's (the container's own), else from the
    root-only file the instance's start script wrote (``KEY=value`` lines)."""
    if os.environ.get(name):
        return os.environ[name]
    try:
        # LORAPOD_PID1_ENVIRON: only lorapod's loopback test hosts set it (compute/hostfacts.py)
        with open(os.environ.get("LORAPOD_PID1_ENVIRON") or "/proc/1/environ", "rb") as fh:
            for item in fh.read().split(b"\0"):
                key, _, value = item.partition(b"=")
                if key.decode(errors="replace") == name and value:
                    return value.decode()
    except OSError:
        pass
    text = read_small(env_file, 1 << 16) if env_file else None
    for line in (text or "").splitlines():
        k, _, v = line.partition("=")
        if k.strip() == name and v.strip():
            return v.strip().strip("'\"")
    return None


USER_AGENT = "lorapod-watchdog"  # never urllib's default: an edge may refuse generic clients (review row 20)
MAX_BODY = 1 << 16  # a provider's answer is read at most this far


def http_call(method: str, url: str, token: str, body: Any = None, timeout: float = 20.0,
              user_agent: str = USER_AGENT) -> tuple[int, Any]:
    """One request; (status, JSON body or None). Bounded in time and in what is read."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json", "User-Agent": user_agent}
    if data is not None:
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read(MAX_BODY)
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, b""
        with contextlib.suppress(OSError):
            raw = exc.read(MAX_BODY)
    try:
        parsed = json.loads(raw) if raw else None
    except ValueError:
        parsed = None
    return status, parsed


def _subst(value: Any, names: dict[str, str]) -> Any:
    """``{NAME}`` in the recipe's strings -> the instance's own variable (never logged)."""
    if isinstance(value, str):
        for k, v in names.items():
            value = value.replace("{" + k + "}", v)
        return value
    if isinstance(value, list):
        return [_subst(v, names) for v in value]
    if isinstance(value, dict):
        return {k: _subst(v, names) for k, v in value.items()}
    return value


def _matches(body: Any, want: dict[str, Any]) -> bool:
    return isinstance(body, dict) and all(k in body and body[k] == v for k, v in want.items())


def run_step(step: dict[str, Any], names: dict[str, str], env_file: str | None, timeout: float,
             user_agent: str) -> str:
    """One way of destroying the instance: 'gone' (the provider says it no longer exists),
    'done' (the provider accepted it) or 'failed'. Secrets stay out of the log."""
    label = str(step.get("name") or step.get("kind"))
    if step.get("kind") == "exec":
        import subprocess

        argv = _subst(list(step.get("argv") or []), names)
        if not argv or shutil.which(argv[0]) is None:
            log(f"{label}: {argv[0] if argv else '?'} is not installed here")
            return "failed"
        env = dict(os.environ)
        for name in step.get("env") or []:
            value = instance_env(name, env_file)
            if value:
                env[name] = value
        try:
            out = subprocess.run(argv, env=env, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError) as exc:
            log(f"{label}: could not run ({type(exc).__name__})")
            return "failed"
        log(f"{label}: exit {out.returncode}")
        return "done" if out.returncode == 0 else "failed"
    token = instance_env(str(step.get("token") or ""), env_file)
    if not token:
        log(f"{label}: no {step.get('token')} in the instance's environment")
        return "failed"
    try:
        status, body = http_call(str(step.get("method") or "GET"), _subst(str(step["url"]), names), token,
                                 _subst(step.get("json"), names), timeout, user_agent)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        log(f"{label}: failed ({type(exc).__name__}: {exc})")
        return "failed"
    if status in (step.get("gone_status") or []) or ("gone_json" in step and status == 200
                                                     and _matches(body, step["gone_json"])):
        log(f"{label}: HTTP {status}, the instance is gone")
        return "gone"
    ok = status in (step.get("done_status") or [])
    if ok and step.get("done_json") is not None:
        ok = _matches(body, step["done_json"])
    if ok and step.get("done_json_key"):  # GraphQL: 200 even on errors; the mutation must answer
        ok = (isinstance(body, dict) and not body.get("errors") and isinstance(body.get("data"), dict)
              and step["done_json_key"] in body["data"])
    msg = ""
    if isinstance(body, dict):
        errs = body.get("errors")
        first = errs[0] if isinstance(errs, list) and errs else None
        text = body.get("msg") or (first.get("message") if isinstance(first, dict) else None)
        msg = str(text)[:200] if text else ""
    log(f"{label}: HTTP {status}" + (" (the scoped key was refused)" if status in (401, 403) else "")
        + (f": {msg}" if msg else "") + ("" if ok else "; not accepted"))
    return "done" if ok else "failed"


def run_recipe(recipe: dict[str, Any], env_file: str | None = None, timeout: float = 20.0) -> bool:
    """The provider's self-destroy recipe (built by its ``api.py``): each step in order until one
    is accepted; with a ``confirm`` step, accepted counts only once the provider says the
    instance is gone. True when destroyed (as far as the provider can tell)."""
    names = {k: str(v) for k, v in (recipe.get("ids") or {}).items()}
    for k in list(names):
        names[k] = instance_env(k, env_file) or names[k]
    ua = str(recipe.get("user_agent") or USER_AGENT)
    confirm = recipe.get("confirm")
    for step in recipe.get("steps") or []:
        result = run_step(step, names, env_file, timeout, ua)
        if result == "gone":
            return True
        if result != "done":
            continue
        if not confirm:
            return True
        for _ in range(3):
            if run_step(confirm, names, env_file, timeout, ua) == "gone":
                log("the provider confirms the instance is gone")
                return True
            time.sleep(2.0)
        log("accepted, but the provider still lists the instance")
    return False


def destroy_through_api(cfg: dict[str, Any]) -> bool:
    """One attempt to destroy this instance through the provider, by its recipe."""
    recipe = cfg.get("destroy")
    if not isinstance(recipe, dict):
        log(f"no self-destroy recipe for {cfg['provider']} in watchdog.json")
        return False
    return run_recipe(recipe, cfg.get("instance_env_file"), float(cfg.get("http_timeout_s") or 20.0))


def destroy(cfg: dict[str, Any], reason: str, attempt: int = 1) -> bool:
    log(f"destroying (attempt {attempt}): {reason}")
    try:
        kill_job(reason)
    except Exception as exc:  # never let stopping the job stand between us and the delete
        log(f"could not stop the job ({type(exc).__name__}: {exc})")
    if "destroy" in cfg:  # a rented machine: its provider wrote how to destroy it (a recipe)
        return destroy_through_api(cfg)
    # ssh / local: the machine is not ours; remove only our work folder, and not while the
    # controller says the results are not home yet (KEEP: its disk was full, compute/pulls.py).
    if os.path.exists("KEEP"):
        log("the results are not home yet (KEEP): the work folder stays for `lorapod pull`")
        return True
    try:
        here = os.getcwd()
    except OSError:  # someone removed it already (lorapod down, the controller): nothing left to do
        log("the work folder is already gone")
        return True
    os.chdir("/")
    shutil.rmtree(here, ignore_errors=True)
    return True


def write_stop(reason: str, run_dir: str = "run") -> None:
    log(f"asking the job to checkpoint and stop ({reason})")
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, "STOP")
    if os.path.islink(path):
        os.unlink(path)
    with open(path, "w") as fh:
        fh.write(reason + "\n")


def load_config() -> dict[str, Any]:
    with open("watchdog.json") as fh:
        return {**DEFAULTS, **json.load(fh)}


class FileClock:
    """File mtimes (wall clock) turned into monotonic times: a file's time is when it last changed,
    as this process saw it. A value seen first is placed by its wall-clock age (never negative),
    every later change at the tick that saw it, so stepping the wall clock moves nothing."""

    def __init__(self) -> None:
        self.seen: dict[str, tuple[float, float]] = {}

    def place(self, key: str, mtime: float | None, mono_now: float, wall_now: float) -> float | None:
        if mtime is None:
            self.seen.pop(key, None)
            return None
        prev = self.seen.get(key)
        if prev is None or prev[0] != mtime:
            age = max(0.0, wall_now - mtime) if prev is None else 0.0
            self.seen[key] = (mtime, mono_now - age)
        return self.seen[key][1]


TIMED_FACTS = ("done_at", "heartbeat", "progress", "stop_written_at")


def single_instance() -> Any:
    """Hold ``watchdog.lock`` for this process's life, or None when another watchdog holds it
    (the controller and the job's runner may both restart a dead one at once)."""
    try:
        fh = open("watchdog.lock", "a")
    except OSError:
        return True  # a full disk: run anyway; two watchdogs beat none
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.close()
        return None
    return fh


def beat() -> None:
    """Touch WATCHDOG_BEAT: the controller's proof, on every poll, that this process still ticks."""
    try:
        os.utime("WATCHDOG_BEAT")
    except FileNotFoundError:
        with contextlib.suppress(OSError):
            open("WATCHDOG_BEAT", "a").close()
    except OSError:
        pass


def main() -> int:
    cfg = load_config()
    held = single_instance()
    if held is None:
        log("another watchdog already watches this folder; exiting")
        return 0
    try:
        with open("watchdog.pid.tmp", "w") as fh:
            fh.write(str(os.getpid()))
        os.replace("watchdog.pid.tmp", "watchdog.pid")
    except OSError as exc:  # a full disk: teardown then finds us by process group instead
        log(f"could not write watchdog.pid ({exc})")
    started = time.monotonic()
    log(f"watching (provider {cfg['provider']}, cap {cap_seconds(cfg)} s, poll {cfg['poll_s']} s)")
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    state = {"attempt": 0, "next_destroy": 0.0, "delay": float(cfg["destroy_backoff_s"]), "clock": FileClock()}
    while True:
        beat()
        try:
            if tick(cfg, started, state):
                return 0
        except Exception as exc:  # whatever goes wrong, the watchdog keeps watching
            log(f"error in a check ({type(exc).__name__}: {exc}); carrying on")
        time.sleep(float(cfg["poll_s"]))


def tick(cfg: dict[str, Any], started: float, state: dict[str, Any]) -> bool:
    """One check; True once the instance is destroyed (the watchdog's work is done). ``started``
    and every duration are on the monotonic clock."""
    now, wall = time.monotonic(), time.time()
    facts = gather()
    clock = state.setdefault("clock", FileClock())
    for key in TIMED_FACTS:
        facts[key] = clock.place(key, facts[key], now, wall)
    action = "destroy" if state["attempt"] else decide(cfg, now, started, facts)
    if action == "destroy":
        if now < state["next_destroy"]:
            return False
        why = ("the job ended and its results were pulled" if facts["job_done"] and facts["pulled"]
               else "a cap, a silent controller or the grace period")
        state["attempt"] += 1
        if destroy(cfg, why, state["attempt"]):
            return True
        # Never give up while the instance may bill: back off to a ceiling and try again.
        log(f"destroy attempt {state['attempt']} failed; next in {state['delay']:.0f} s")
        state["next_destroy"] = now + state["delay"]
        state["delay"] = min(float(cfg["destroy_backoff_max_s"]), state["delay"] * 2)
    elif action == "stop":
        cap = cap_seconds(cfg)
        elapsed = float(cfg["elapsed_at_start_s"]) + (now - started)
        write_stop("budget or time cap is near" if cap is not None and elapsed >= cap - float(cfg["cap_margin_s"])
                   else f"no progress for {cfg['stall_s']:.0f} s")
    elif action == "kill":
        kill_job("did not stop after STOP")
    return False


if __name__ == "__main__":
    code = main()
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
    os._exit(code)  # not sys.exit: a full disk would fail the final flush and turn success into 120
