"""The dead man's switch: an instance that no controller reaches destroys itself.

Between a create and the first SSH command nothing on the instance guards it: the watchdog
(:mod:`lorapod.compute.watchdog`) is started over SSH. A controller killed in that window (a
``lorapod run`` SIGKILLed while it rents a spot replacement, a ``doctor`` killed before its pod
answers) used to leave the instance billing until the user ran ``ps`` or ``down --orphans``. But
both providers hand the instance a scoped key from its first second (RunPod's pod-scoped
``RUNPOD_API_KEY``, Vast.ai's ``CONTAINER_API_KEY``: "can only start, stop, or destroy that
specific instance", vast-ai/docs api-reference/hello-world.mdx), and both run a start command that
the create names (RunPod: the container's command, REST ``dockerStartCmd`` / GraphQL
``dockerArgs``; Vast.ai: ``onstart``). RunPod's own docs show the pattern from inside a pod:
"sleep 2h; runpodctl stop pod $RUNPOD_POD_ID &" (docs.runpod.io, Manage Pods, "Stop a Pod after a
specific time").

So every create carries a :class:`DeadMan`: its start command launches, in the background, a
small standard-library Python program (:data:`SWITCH_PY`) that waits ``after_s`` from the
container's start and then destroys the instance with the provider's own self-destroy recipe
(the watchdog's, from the provider's ``api.py``), retrying with backoff until the instance, and
with it the program, is gone. A controller that reaches the instance disarms it (:meth:`disarm`:
the program is killed, matched by its token, not by a name) right after the watchdog is proven
alive, so from the create to the end of the job one of the two always guards the instance.

What it costs: an instance whose controller cannot reach it within ``after_s`` of its container's
start (an sshd that is slow to come up, a key that arrives late) is destroyed at ``after_s``
whether a controller is still trying or not; the controller knows the window and gives the
instance up itself just before it (acquire.py), so such a boot costs ``after_s`` minutes of that
instance's rate and the next offer is tried. ``after_s`` defaults to twice the plan's "boot +
install" time, 10 to 60 minutes (:func:`lorapod.plan.cost.deadman_minutes`, which ``lorapod plan``
prints; ``compute.deadman_min`` sets it, 0 turns it off), and counts from the container's start, so
an image pull before it never eats into it.

A container restarted on the same disk (Vast.ai resuming a paused instance) runs its start
command again, so the switch is armed again until a controller reaches it again: the mark a
controller leaves when it reaches the instance counts only if it is newer than the container's
own start (PID 1's), which also covers a start command that runs a moment after sshd answers. An image whose
start command lorapod cannot wrap (a RunPod image not in the catalog: replacing its command would
lose its sshd) gets no switch; the disarm says so, and the watchdog guards it from its first SSH
command on, as before.
"""

from __future__ import annotations

import base64
import json
import secrets
import zlib
from dataclasses import dataclass, field
from typing import Any

#: the switch's own files on the instance: ``<BASE>-<token>.pid`` and ``.log`` (``/tmp`` exists on
#: every image and is the container's own; the token keeps two instances on one host apart)
BASE = "/tmp/.lorapod-switch"
#: where an image keeps a Python when ``python3`` is not on the start command's PATH
#: (catalog/images.py: the official RunPod images' /usr/local/bin, Vast's /venv/main, conda's)
PYTHONS = ("python3", "python", "/usr/local/bin/python", "/venv/main/bin/python", "/opt/conda/bin/python")

#: The program the start command runs (standard library only, any Python 3): the wait, then the
#: provider's recipe (its ``http`` and ``exec`` steps, ``{VAR}`` from the container's variables)
#: every 2, 4 ... 60 s until the destroy takes the process with it. Never logs a secret.
SWITCH_PY = r'''
import json, os, shutil, subprocess, time, urllib.error, urllib.request
C = json.loads(CONFIG)
def log(m):
    try:
        with open(C["log"], "a") as f:
            f.write(time.strftime("%Y-%m-%dT%H:%M:%S ") + m + "\n")
    except OSError:
        pass
def sub(v):
    if isinstance(v, str):
        for k in C["vars"]:
            v = v.replace("{" + k + "}", os.environ.get(k, ""))
        return v
    if isinstance(v, list):
        return [sub(x) for x in v]
    if isinstance(v, dict):
        return {k: sub(x) for k, x in v.items()}
    return v
def container_start():
    try:
        with open("/proc/stat") as f:
            btime = next(float(x.split()[1]) for x in f if x.startswith("btime"))
        with open("/proc/1/stat") as f:
            ticks = float(f.read().rsplit(")", 1)[1].split()[19])
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except Exception:
        return 0.0
def reached():
    try:
        return os.stat(C["reached"]).st_mtime >= container_start() - 1
    except OSError:
        return False
if reached():
    log("a controller already reached this instance since its container started: not armed")
    raise SystemExit(0)
end = time.monotonic() + C["after_s"]
log("armed: this instance destroys itself in %.0f s unless a controller reaches it" % C["after_s"])
while time.monotonic() < end:
    time.sleep(max(0.05, min(5.0, end - time.monotonic())))
    if reached():
        log("a controller reached this instance: disarmed")
        raise SystemExit(0)
log("no controller reached this instance: destroying it with its scoped key")
delay, n = 2.0, 0
while True:
    n += 1
    for s in C["steps"]:
        name = s.get("name", "?")
        try:
            if s.get("kind") == "exec":
                argv = sub(s["argv"])
                if shutil.which(argv[0]) is None:
                    continue
                env = dict(os.environ)
                r = subprocess.run(argv, env=env, timeout=30, capture_output=True, stdin=subprocess.DEVNULL)
                log("%s: exit %d" % (name, r.returncode))
                continue
            body = sub(s.get("json"))
            req = urllib.request.Request(sub(s["url"]), method=s.get("method", "GET"),
                                         data=None if body is None else json.dumps(body).encode(),
                                         headers={"Authorization": "Bearer " + os.environ.get(s.get("token", ""), ""),
                                                  "Content-Type": "application/json", "User-Agent": C["ua"]})
            with urllib.request.urlopen(req, timeout=20) as r:
                log("%s: HTTP %d" % (name, r.status))
        except urllib.error.HTTPError as e:
            log("%s: HTTP %d" % (name, e.code))
        except Exception as e:
            log("%s: %s" % (name, type(e).__name__))
    log("attempt %d: the instance still runs; again in %.0f s" % (n, delay))
    time.sleep(delay)
    delay = min(60.0, delay * 2)
'''


@dataclass(frozen=True)
class DeadMan:
    """One instance's switch: ``after_s`` from its container's start, and the provider's recipe."""

    after_s: float
    recipe: dict[str, Any] = field(default_factory=dict)
    token: str = field(default_factory=lambda: secrets.token_hex(8))

    @property
    def base(self) -> str:
        return f"{BASE}-{self.token}"

    def program(self) -> str:
        """The switch as one shell-safe word (base64 of zlib of the Python, no quote or space)."""
        steps = [s for s in self.recipe.get("steps") or [] if s.get("kind") in ("http", "exec")]
        config = {"after_s": float(self.after_s), "log": f"{self.base}.log", "reached": f"{self.base}.reached",
                  "steps": steps,
                  "vars": sorted({*(self.recipe.get("ids") or {}), *(str(s.get("token") or "") for s in steps)} - {""}),
                  "ua": str(self.recipe.get("user_agent") or "lorapod-switch")}
        code = "CONFIG = " + repr(json.dumps(config)) + "\n" + SWITCH_PY
        return base64.b64encode(zlib.compress(code.encode(), 9)).decode()

    def launcher(self) -> str:
        """Shell (POSIX sh) that starts the switch in the background and returns at once: the first
        Python found runs it; none, and the log says the switch could not be armed."""
        pythons = " ".join(PYTHONS)
        run = (f"nohup \"$p\" -c \"import base64,zlib;exec(zlib.decompress(base64.b64decode('{self.program()}')))\" "
               f"lorapod-switch-{self.token} >/dev/null 2>&1 & echo $! > {self.base}.pid")
        return (f"(umask 077; for p in {pythons}; do if command -v \"$p\" >/dev/null 2>&1; then {run}; exit 0; fi; "
                f"done; echo 'no Python on this image: the switch is not armed' > {self.base}.log)")

    def disarm(self) -> str:
        """Shell that marks the instance reached in this container's life (``<base>.reached``,
        newer than PID 1's start: a switch launched a moment later by a start command that runs
        after sshd, or one whose kill fails, sees it and stands down; a container restarted later
        arms it again), then ends the switch when it still runs (matched by its token in its
        command line, never by name). Prints ``LPSW disarmed``, ``LPSW none`` (none running
        here) or ``LPSW dead`` with its log's tail (armed, but not running: no Python, or killed)."""
        f = self.base
        return (f"touch {f}.reached 2>/dev/null; p=$(head -c 20 {f}.pid 2>/dev/null | tr -cd 0-9); "
                f"if [ -n \"$p\" ] && tr '\\0' ' ' < /proc/$p/cmdline 2>/dev/null | grep -q 'lorapod-switch-{self.token}' "
                f"&& kill \"$p\" 2>/dev/null; then echo 'LPSW disarmed'; "
                f"elif [ -f {f}.log ] || [ -f {f}.pid ]; then echo 'LPSW dead'; tail -c 300 {f}.log 2>/dev/null; "
                f"else echo 'LPSW none'; fi")


def describe(out: str, dm: DeadMan) -> str:
    """What :meth:`DeadMan.disarm` printed, said for the run's log."""
    head, _, rest = out.strip().partition("\n")
    if head == "LPSW disarmed":
        return "dead man's switch disarmed: this controller reached the instance (its watchdog guards it from here)"
    if head == "LPSW dead":
        return (f"the dead man's switch was not running on the instance ({rest.strip()[-200:] or 'no log'}); "
                "its watchdog guards it from here")
    return "no dead man's switch on this instance (its start command could not carry one); its watchdog guards it"
