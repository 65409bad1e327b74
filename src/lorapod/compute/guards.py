"""Two guards on the instance that watch each other, and the controller that watches the watchdog.

The watchdog (:mod:`lorapod.compute.watchdog`) destroys the instance when nobody else will. A host
that kills it used to go unnoticed: the run finished `done` with nothing said, and had the
controller died too, the instance billed until someone ran `down --orphans`. So (DESIGN
invariant 9):

* the controller checks the watchdog on every poll (:data:`WATCHDOG_PROBE`: its pid is alive and
  its ``WATCHDOG_BEAT`` recent) and starts it again when it is gone (:func:`restart_watchdog`),
  saying so; `ps` shows a job whose watchdog is down;
* the job's runner starts ``guard.sh`` (:func:`guard_script`) beside the job: when the watchdog
  is gone *and* the controller is silent (``HEARTBEAT`` older than the watchdog's own timeout),
  it starts the watchdog again, which then runs the same self-destroy it always does. The guard
  lives in the job's process group, so it ends with the job (and with every stop of it).

At most one watchdog runs per work folder (it locks ``watchdog.lock``), so both guards may
restart it at once without two of them running.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from lorapod.compute.trust import guarded_read

#: Seconds of ``WATCHDOG_BEAT`` silence after which a watchdog whose pid still answers counts
#: as hung, at the least (a multiple of its poll interval otherwise).
MIN_BEAT_S = 5.0


def beat_limit_s(watchdog_cfg: dict[str, Any]) -> float:
    return max(MIN_BEAT_S, 5.0 * float(watchdog_cfg.get("poll_s") or 10.0))


def _mtime(name: str) -> str:
    # GNU/busybox stat, then BSD stat (an ssh:// Mac); empty when neither answers
    q = shlex.quote(name)
    return f"$(stat -c %Y {q} 2>/dev/null || stat -f %m {q} 2>/dev/null)"


def watchdog_probe(limit_s: float) -> str:
    """Shell lines for the poll: ``LP wd=1`` (alive and beating), ``wd=0`` (gone, or silent for
    more than ``limit_s``), ``wd=?`` (no pid file yet: starting)."""
    return (
        f"wpid=$({guarded_read('head -c 20', 'watchdog.pid')} | tr -cd 0-9); wd='?'\n"
        f'b={_mtime("WATCHDOG_BEAT")}; n=$(date +%s); fresh=0\n'
        f'[ -n "$b" ] && [ $((n - b)) -le {int(limit_s)} ] && fresh=1\n'
        'if [ -n "$wpid" ]; then wd=0; kill -0 "$wpid" 2>/dev/null && { [ -z "$b" ] || [ "$fresh" = 1 ]; } && wd=1\n'
        'elif [ "$fresh" = 1 ]; then wd=1; fi\n'  # no pid file (a full disk) but it beats: alive
        'echo "LP wd=$wd"\n'
    )


def parse_probe(line: bytes) -> bool | None:
    """True (alive), False (gone) or None (not known yet) from the probe's ``LP wd=`` line."""
    text = line.decode(errors="replace").strip()
    if not text.startswith("LP wd="):
        return None
    value = text.removeprefix("LP wd=")
    return True if value == "1" else False if value == "0" else None


def restart_watchdog(work: Any, cfg: dict[str, Any], python: str) -> None:
    """Put watchdog.py and its config back (a host may have removed them) and start it, detached,
    in one round trip. Unlike the first start nothing else is reset: the job keeps running."""
    import lorapod.compute.watchdog as wd

    files = {"watchdog.py": (Path(wd.__file__).read_bytes(), 0o600),
             "watchdog.json": (json.dumps(cfg).encode(), 0o600)}
    # the dead one's pid file goes first, so the proof that follows (RemoteWork.watchdog_alive)
    # reads the new watchdog's pid, or its launch pid, never the killed one's
    work.put_files(files, then=f"rm -f watchdog.pid && {{ setsid nohup {shlex.quote(python)} watchdog.py >> "
                               "watchdog.log 2>&1 < /dev/null & echo $! > watchdog.launch; }")


def guard_script(python: str, stale_s: float, every_s: float, most: int = 20) -> bytes:
    """``guard.sh JOB_PID``, run by job.sh beside the job: every ``every_s``, if the watchdog is
    gone and ``HEARTBEAT`` is older than ``stale_s`` (the controller is gone too), start the
    watchdog again (at most ``most`` times). It ends once the job is over and a watchdog
    watches, when the results are home (PULLED), or when the folder is being removed."""
    py = shlex.quote(python)
    return f"""#!/usr/bin/env bash
# lorapod's second guard (lorapod/compute/guards.py): restarts the watchdog when both it and
# the controller are gone, so the instance's self-destroy never depends on one process.
job="$1"; starts=0
while [ "$starts" -lt {int(most)} ]; do
  sleep {max(0.2, float(every_s)):.2f}
  # the folder is being removed (the watchdog's own destroy), or the results are home
  {{ [ ! -f watchdog.py ] || [ -f PULLED ]; }} && break
  wpid=$({guarded_read('head -c 20', 'watchdog.pid')} | tr -cd 0-9)
  if [ -n "$wpid" ] && kill -0 "$wpid" 2>/dev/null; then
    # the job is over and the watchdog watches: it takes it from here
    {{ [ -f job.exit ] || ! kill -0 "$job" 2>/dev/null; }} && break
    continue
  fi
  hb={_mtime("HEARTBEAT")}; now=$(date +%s)
  [ -n "$hb" ] && [ $((now - hb)) -le {int(stale_s)} ] && continue  # the controller restarts it
  echo "$(date +%Y-%m-%dT%H:%M:%S) guard: the watchdog and the controller are both gone; starting the watchdog again"
  {{ setsid nohup {py} watchdog.py >> watchdog.log 2>&1 < /dev/null & }}
  starts=$((starts + 1))
  sleep 2
done
""".encode()
