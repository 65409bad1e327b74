"""The job's work folder on an instance, and every shell command lorapod runs there.

```
~/.lorapod-work/.envs/<hash>/  the job's Python environment, by lock hash (compute/bootstrap.py)
~/.lorapod-work/<job-id>/      (relative to the login directory)
  run/            the run folder (same layout as locally); run/STOP asks the trainer to
                  save a checkpoint and exit
  data/           the synced dataset (rsync: only changed files move)
  pkg/            lorapod itself (source copy or installed wheel), on PYTHONPATH
  job.sh          wrapper: records job.pid, runs the job, writes job.exit with its status
  job.log         the job's stdout + stderr
  watchdog.py     the on-instance watchdog (+ watchdog.json, watchdog.log, watchdog.pid)
  HEARTBEAT       touched by the controller on every poll
  PULLED          written by the controller once the final pull is verified
  secrets.env     0600, sent over stdin, sourced by job.sh (only what the job needs)
```

The job runs under ``setsid nohup`` so an SSH drop or a dead controller does not kill it; its
process id is also its process group, so stopping it stops everything it started.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lorapod.compute.bootstrap import AUTO_PYTHON, Bootstrap
from lorapod.compute.guards import parse_probe, watchdog_probe
from lorapod.compute.transport import SyncStats, Transport
from lorapod.compute.trust import MANIFEST_PY, guarded_read, is_regular, safe_relpath, tail_after
from lorapod.errors import RemoteError
from lorapod.rundir.layout import METRICS, STOP

WORK_ROOT = ".lorapod-work"
#: The run folder's files as the work folder names them (``run/`` is the run folder on the instance).
RUN_METRICS = f"run/{METRICS}"
RUN_STOP = f"run/{STOP}"
#: ``--python auto``: the interpreter is found on the instance (:mod:`lorapod.compute.hostfacts`).
#: How long the watchdog has to prove it runs (its pid answers ``kill -0``, its first log line is there).
WATCHDOG_PROOF_S = 20.0
#: How long installing rsync may take (``apt-get update`` on a cold mirror is the slow part).
RSYNC_INSTALL_S = 300.0


def work_root() -> str:
    """Where work folders go on the instance: ``LORAPOD_REMOTE_ROOT`` or ``~/.lorapod-work``."""
    return os.environ.get("LORAPOD_REMOTE_ROOT") or WORK_ROOT
#: Written only on this machine, beside what is pulled: never uploaded, never overwritten.
LOCAL_ONLY = ("/remote-events.log", "/job.log", "/watchdog.log", "/spec.yaml", "/env.log")
#: Never pulled: temporary checkpoint folders, rsync leftovers, the stop request itself, the
#: instance's spec.yaml (its paths point at the instance; the local one keeps local paths), and
#: the writer's lock (rundir.WriterLock: each machine's folder has its own writer).
PULL_EXCLUDES = (".tmp-*", ".old-*", ".rsync-partial", STOP, "__pycache__", ".lock", *LOCAL_ONLY)

JOB_SH = r"""#!/usr/bin/env bash
# Started as `setsid nohup bash job.sh CMD...`: its pid is the job's process group.
cd "$(dirname "$0")" || exit 1
echo $$ > job.pid.tmp && mv job.pid.tmp job.pid
export PYTHONPATH="$PWD/pkg${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export LORAPOD_REMOTE_JOB=1  # the controller measures the run for the planner (plan/learned.py)
if [ -f secrets.env ]; then set -a; . ./secrets.env; set +a; fi
# the CUDA caching allocator grows expandable segments unless the user chose one (--forward-env) (engine/device.py ALLOC_CONF)
if [ -z "${PYTORCH_ALLOC_CONF:-}" ] && [ -z "${PYTORCH_CUDA_ALLOC_CONF:-}" ]; then
  export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; fi
# the second guard (compute/guards.py), in this process group: it ends with the job
if [ -f guard.sh ]; then bash guard.sh "$$" >> watchdog.log 2>&1 < /dev/null & fi
# a SIGTERM to this wrapper alone (the container's init on a spot pod, compute/remote.py SPOT_INIT)
# goes on to the job, which saves its checkpoint and exits 75 (lorapod.errors.PREEMPTED_EXIT);
# the job runs in the background so the trap runs at once, not after the job ends
jobs_dir="${LORAPOD_JOBS_DIR:-/tmp/.lorapod-jobs}"
mkdir -p "$jobs_dir" 2>/dev/null && : > "$jobs_dir/$$" 2>/dev/null
"$@" >> job.log 2>&1 &
child=$!
trap 'kill -TERM "$child" 2>/dev/null' TERM
rc=256
# wait returns >128 when the trap interrupts it: wait again while the job still runs
while [ "$rc" -ge 256 ] || { [ "$rc" -gt 128 ] && kill -0 "$child" 2>/dev/null; }; do wait "$child"; rc=$?; done
if [ "$rc" -gt 128 ]; then wait "$child" 2>/dev/null; r=$?; [ "$r" != 127 ] && rc=$r; fi
echo "$rc" > job.exit.tmp && mv job.exit.tmp job.exit
rm -f "$jobs_dir/$$"
"""

#: The container's first process on a spot pod (RunPod's ``dockerArgs``), replacing the image's
#: start script as PID 1 and starting that script itself. Why: a preemption stops the container
#: the way ``docker stop`` does, with SIGTERM to PID 1 alone and SIGKILL 5 s later (runpod/docs
#: pods/pricing.mdx). The official images' PID 1 is ``start.sh``, a bash script that ends in
#: ``sleep infinity`` with no trap (runpod/containers container-template/start.sh), and the
#: kernel drops a signal to a namespace's init that has no handler (pid_namespaces(7)): lorapod's
#: job, started over SSH, would never hear of it and would lose everything since its last
#: checkpoint. This init sends SIGTERM on to every running job.sh (:data:`JOB_SH` forwards it to
#: the trainer), then stays until they are gone, since the container, and the save with it, ends
#: when PID 1 does. ``{start}`` is the image's own start command.
SPOT_INIT = r"""jobs_dir="${LORAPOD_JOBS_DIR:-/tmp/.lorapod-jobs}"
running() { for f in "$jobs_dir"/*; do [ -e "$f" ] && kill -0 "${f##*/}" 2>/dev/null && return 0; done; return 1; }
stop() {
  for f in "$jobs_dir"/*; do [ -e "$f" ] && kill -TERM "${f##*/}" 2>/dev/null; done
  while running; do sleep 0.1; done
  exit 0
}
trap stop TERM INT
{start} &
wait $!
while :; do sleep 3600 & wait $!; done
"""


def spot_init_args(start: str) -> str:
    """The container command that runs :data:`SPOT_INIT` as PID 1 around the image's ``start``.

    One word with no space or quote (the script travels base64-encoded, spaces as ``${IFS}``), so
    it means the same whether the provider splits its command string like a shell or on blanks."""
    import base64

    script = SPOT_INIT.replace("{start}", start)
    b64 = base64.b64encode(script.encode()).decode()
    return f"sh -c echo${{IFS}}{b64}|base64${{IFS}}-d>/tmp/.lorapod-init.sh;exec${{IFS}}bash${{IFS}}/tmp/.lorapod-init.sh"



def default_job_command(python: str, spec: str, run_dir: str, resume: bool) -> list[str]:
    """The command run on the instance. The one place to change what "training" means there.

    ``lorapod train SPEC --run-dir DIR`` continues from the newest ``checkpoints/step-N`` when
    DIR already has one (which is how ``lorapod run --resume`` works: the pulled run folder is
    uploaded first), and honours ``<run_dir>/STOP`` by saving a checkpoint and exiting 0.
    """
    return [python, "-m", "lorapod", "train", spec, "--run-dir", run_dir]


def job_command_from_env(python: str, spec: str, run_dir: str, resume: bool) -> list[str]:
    """``LORAPOD_JOB_COMMAND`` (a template with {python} {spec} {run_dir} {resume}) replaces
    the trainer, e.g. to run your own script; otherwise :func:`default_job_command`."""
    template = os.environ.get("LORAPOD_JOB_COMMAND")
    if not template:
        return default_job_command(python, spec, run_dir, resume)
    values = {"python": python, "spec": spec, "run_dir": run_dir, "resume": "--resume" if resume else ""}
    return [arg for arg in (part.format(**values) for part in shlex.split(template)) if arg]


class NoGpuForTorch(RemoteError):
    """The instance has an NVIDIA GPU and the job's torch cannot compute on it: the job would train
    on the CPU of a rented GPU, billing for hours (review N4). Raised before the job starts; the
    instance is destroyed."""


def check_gpu_torch(gpus: Any, stdout: bytes, python: str) -> None:
    """The start probe's verdict on a GPU instance (``LPCUDAOK`` line, envsetup's GPU probe run with
    the job's interpreter), or :class:`NoGpuForTorch` in one line saying why."""
    from lorapod.compute.hostfacts import _marked

    said = (_marked(stdout, "LPCUDAOK ") or [""])[-1]
    try:
        result = json.loads(said) if said.startswith("{") else {"why": said or "the probe printed nothing"}
    except ValueError:
        result = {"why": said[:300]}
    if result.get("ok") is True:
        return
    torch_v = result.get("torch") or "?"
    built = f" (built for CUDA {result['cuda']})" if result.get("cuda") else ""
    raise NoGpuForTorch(
        f"the job's torch {torch_v}{built} cannot use the instance's GPU ({gpus.describe()}): "
        f"{str(result.get('why', '?'))[:300]}; the job would train on its CPU, so it is not started and the "
        "instance is destroyed",
        hint=f"{python} must have a torch built for a CUDA the driver runs; pick another offer or an image "
             "whose torch matches its driver (--image), or set LORAPOD_TORCH_INDEX to a mirror of torch's index")


def with_device(argv: list[str], device: str) -> list[str]:
    """``argv`` with ``--device DEVICE`` after ``-m lorapod train`` (torchrun's form included):
    remote jobs run on the device the start probe confirmed, never on whatever torch finds. A
    custom command (``LORAPOD_JOB_COMMAND``, an external trainer) is left as it is."""
    for i in range(len(argv) - 2):
        if argv[i:i + 3] == ["-m", "lorapod", "train"] and "--device" not in argv:
            return [*argv, "--device", device]
    return argv


class WatchdogNotRunning(RemoteError):
    """The watchdog was launched but does not run: nothing would destroy the instance if we died."""


@dataclass
class JobStatus:
    alive: bool
    exit: str | None
    metrics: bytes = b""
    gone: bool = False
    stop: str | None = None  # the content of run/STOP, if someone (the watchdog) asked the job to stop
    watchdog: bool | None = None  # alive and beating / gone / not known (compute/guards.py)

    @property
    def done(self) -> bool:
        return self.gone or self.exit is not None or not self.alive


@dataclass
class RemoteWork:
    transport: Transport
    job_id: str
    root: str = field(default_factory=work_root)
    facts: dict = field(default_factory=dict)
    local_log: Path | None = None  # where the instance's setup output is kept (the run folder's env.log)
    #: a folder on a network volume for the environment, model and latent caches (volume_mount.py)
    cache_root: str | None = None

    @property
    def dir(self) -> str:
        return f"{self.root}/{self.job_id}"

    def q(self, rel: str = "") -> str:
        return shlex.quote(f"{self.dir}/{rel}" if rel else self.dir)

    def sh(self, script: str, input: bytes | None = None, timeout: float = 60.0,
           check: bool = True) -> subprocess.CompletedProcess[bytes]:
        return self.transport.run(script, input=input, timeout=timeout, check=check)

    # ------------------------------------------------------------------ what the host has

    def probe(self, boot: Bootstrap, container: bool = True) -> tuple[Bootstrap, Any, Any]:
        """Ask the host what it has (two short round trips, shell only) and choose the Python
        (``container``: PID 1's PATH first, as on a rented image; else the session's first).

        Returns the bootstrap with ``python`` set to the interpreter found, the
        :class:`~lorapod.compute.hostfacts.HostFacts` and the :class:`~lorapod.compute.hostfacts.Choice`."""
        from dataclasses import replace

        from lorapod.compute import hostfacts as hf

        facts = hf.parse_facts(self.sh(hf.facts_script(), timeout=30, check=False).stdout)
        explicit = None if boot.python == AUTO_PYTHON else boot.python
        cands = hf.candidates(facts, explicit, container, recorded=boot.image_python)
        facts.pythons = hf.parse_pythons(self.sh(hf.pythons_script([c for c, _ in cands]), timeout=90,
                                                 check=False).stdout, cands)
        choice = hf.choose(facts.pythons, explicit)
        self.facts["host"] = facts.to_dict()
        return replace(boot, python=choice.python, driver_cuda=facts.gpus.cuda), facts, choice

    def provide_rsync(self, facts: Any, deadline_s: float = RSYNC_INSTALL_S) -> str:
        """rsync on the instance, or files over the SSH connection with tar; says which, in words.

        rsync is installed when the host allows it (root and apt-get, dnf or yum), bounded by
        ``deadline_s``; otherwise, or when that fails, the transport moves files with tar."""
        if facts.has("rsync"):
            return f"rsync at {facts.tools['rsync']}"
        if not hasattr(self.transport, "mover"):
            return "rsync: not needed here"
        if not facts.has("tar"):
            raise RemoteError("the instance has neither rsync nor tar, so no file can be moved to it",
                              hint="use an image that has rsync or tar (--image)")
        why = "not root" if not facts.root else "no apt-get, dnf or yum"
        manager = next((m for m in ("apt-get", "dnf", "yum") if facts.has(m)), None)
        if facts.root and manager:
            install = {"apt-get": "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
                                  "--no-install-recommends rsync",
                       "dnf": "dnf install -y -q rsync", "yum": "yum install -y -q rsync"}[manager]
            t0 = time.monotonic()
            # the host ends its own install at the deadline (coreutils timeout) so nothing lingers there
            bounded = (f'T=""; command -v timeout >/dev/null 2>&1 && T="timeout -k 5 {int(deadline_s)}"; '
                       f"$T sh -c {shlex.quote(install)} >/dev/null 2>&1; command -v rsync")
            try:
                out = self.sh(bounded, timeout=deadline_s + 15, check=False)
            except RemoteError as exc:  # the deadline (or a dropped link): tar works all the same
                out, why = None, f"installing it with {manager} did not finish ({exc.message[:120]})"
            found = out.stdout.decode(errors="replace").strip().splitlines()[-1:] if out is not None else []
            if found and found[0].startswith("/"):
                facts.tools["rsync"] = found[0][:500]
                return f"rsync was missing; installed it with {manager} in {time.monotonic() - t0:.0f} s"
            if out is not None:
                why = f"{manager} could not install it"
        self.transport.mover = "tar"
        return f"rsync is not on the instance ({why}): files move with tar over the SSH connection"

    # ------------------------------------------------------------------ setup

    def prepare(self) -> None:
        """Make the work folder and put the job wrapper and the watchdog in it (one round trip)."""
        import lorapod.compute.watchdog as wd

        self.put_files({"job.sh": (JOB_SH.encode(), 0o700), "watchdog.py": (Path(wd.__file__).read_bytes(), 0o600)},
                       before=f"mkdir -p {self.q('run')} {self.q('data')} {self.q('pkg')} && chmod 700 {self.q()}")

    def put_files(self, files: dict[str, tuple[bytes, int]], before: str = "", then: str = "") -> None:
        """Write several files with one command, as a tar stream on stdin (never argv: secrets
        stay out of `ps` on both machines), then run ``then`` in the work folder."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for rel, (data, mode) in files.items():
                info = tarfile.TarInfo(rel)
                info.size, info.mode, info.mtime = len(data), mode, int(time.time())
                tar.addfile(info, io.BytesIO(data))
        script = f"{before + ' && ' if before else ''}cd {self.q()} && umask 077 && tar -xf - --no-same-owner"
        self.sh(script + (f" && {then}" if then else ""), input=buf.getvalue())

    def write_file(self, rel: str, data: bytes, mode: int = 0o600) -> None:
        self.put_files({rel: (data, mode)})

    def bootstrap(self, boot: Bootstrap, wheel_cache: Path) -> dict:
        """Put lorapod on the instance, give the job its environment, check it starts, read GPU facts.

        ``facts["job_python"]`` is the interpreter the job must run with; ``facts["env"]`` says how
        the environment came to be (:class:`lorapod.compute.bootstrap.EnvResult`)."""
        import lorapod
        from lorapod.compute.bootstrap import EnvResult

        if boot.strategy == "source":
            pkg = Path(lorapod.__file__).parent
            self.transport.push(pkg, f"{self.dir}/pkg/lorapod", delete=True, excludes=("__pycache__",))
        else:
            wheel = build_wheel(wheel_cache)
            self.transport.push(wheel, f"{self.dir}/{wheel.name}")
            py = shlex.quote(boot.python)
            self.sh(f"cd {self.q()} && {py} -m pip install -q --no-deps --upgrade --target pkg {shlex.quote(wheel.name)}",
                    timeout=600)
        if boot.deps == "auto":
            env = self.environment(boot)
        else:
            env = EnvResult(python=boot.python, how="as-is", installed=0, seconds=0.0)
        from lorapod.compute import hostfacts
        from lorapod.compute.envsetup import GPU_PROBE

        # Marked lines only: an interpreter (or a login script) that prints a banner first still works.
        probe = ("import json, sys, lorapod; print('LPSTART ' + json.dumps({'python': sys.version.split()[0], "
                 "'lorapod': lorapod.__version__, 'path': lorapod.__file__}))")
        # On a GPU instance the job's torch must compute on the GPU (envsetup's probe: is_available and
        # a matmul), checked here, before the job starts, so that it never trains on the CPU (review N4).
        gpu = (f'if command -v nvidia-smi >/dev/null 2>&1 && [ -n "$(nvidia-smi -L 2>/dev/null | head -c 200)" ]; '
               f"then PYTHONPATH=$PWD/pkg {shlex.quote(env.python)} -c {shlex.quote(GPU_PROBE)} 2>&1 "
               "| tail -n 1 | head -c 2000 | sed 's/^/LPCUDAOK /'; fi")
        out = self.sh(f"cd {self.q()} && PYTHONPATH=$PWD/pkg {shlex.quote(env.python)} -c {shlex.quote(probe)};"
                      f" {hostfacts.gpu_script()}{gpu}", check=False, timeout=420)
        lines = out.stdout.decode(errors="replace").strip().splitlines()
        start = [x[len("LPSTART "):] for x in lines if x.startswith("LPSTART {")][:1]
        if not start:
            said = (out.stderr.decode(errors="replace").strip()[-300:] or "nothing on stderr") + "; stdout: " + \
                (out.stdout.decode(errors="replace").strip()[-200:] or "nothing") + f" (exit {out.returncode})"
            raise RemoteError(f"lorapod does not start on the instance with {env.python}: {said}",
                              hint="the instance needs Python >= 3.11 and access to a package index; "
                                   "pass --python PATH for another interpreter")
        facts = json.loads(start[0])
        if facts["lorapod"] != lorapod.__version__:
            raise RemoteError(f"the instance runs lorapod {facts['lorapod']}, this machine {lorapod.__version__}")
        gpus = hostfacts.parse_gpus(out.stdout)
        facts["gpus"] = [f"{n} (driver {gpus.driver}, CUDA {gpus.cuda})" for n in gpus.names]
        facts["job_python"] = env.python
        facts["env"] = env
        facts["device"] = "cpu"
        if gpus.names:
            facts["device"] = "cuda"
            check_gpu_torch(gpus, out.stdout, env.python)
        self.facts = facts
        return facts

    def environment(self, boot: Bootstrap) -> Any:
        """Run :mod:`lorapod.compute.envsetup` under ``boot.python`` (sent on stdin: nothing of
        lorapod needs to be importable there yet) and return its :class:`EnvResult`."""
        from lorapod.compute.bootstrap import derive_lock, env_request, envsetup_source, parse_result

        request = env_request(derive_lock(boot.extra), boot.python, self.cache_root or self.root, boot.driver_cuda)
        out = self.sh(f"cd {self.q()} && {shlex.quote(boot.python)} - {shlex.quote(json.dumps(request))}",
                      input=envsetup_source(), timeout=3600, check=False)
        if self.local_log is not None:
            with open(self.local_log, "ab") as fh:
                fh.write(out.stderr)
        return parse_result(out.stdout.decode(errors="replace"), out.stderr.decode(errors="replace"), boot.python)

    def push_path(self, local: Path, dest_rel: str, delete: bool = True, excludes: tuple[str, ...] = ()) -> SyncStats:
        return self.transport.push(local, f"{self.dir}/{dest_rel}", delete=delete and local.is_dir(),
                                   excludes=excludes)

    # ------------------------------------------------------------------ processes

    def start_watchdog(self, watchdog: dict, python: str) -> None:
        """Make the work folder and start the watchdog, detached, in one round trip: the first
        thing after SSH answers, before any bootstrap, so a controller that dies from here on
        still leaves something that destroys the instance. Standard library only."""
        import lorapod.compute.watchdog as wd

        files = {"job.sh": (JOB_SH.encode(), 0o700), "watchdog.py": (Path(wd.__file__).read_bytes(), 0o600),
                 "watchdog.json": (json.dumps(watchdog).encode(), 0o600)}
        self.put_files(files, before=f"mkdir -p {self.q('run')} {self.q('data')} {self.q('pkg')} && chmod 700 {self.q()}",
                       then=(f"rm -f PULLED job.exit job.killing job.pid watchdog.pid {RUN_STOP} && touch HEARTBEAT && "
                             f"{{ setsid nohup {shlex.quote(python)} watchdog.py >> watchdog.log 2>&1 < /dev/null & "
                             "echo $! > watchdog.launch; }"))

    def watchdog_alive(self, within_s: float = WATCHDOG_PROOF_S) -> int:
        """Proof that the watchdog runs: its pid answers ``kill -0`` and its first log line
        ("watching ...", :func:`lorapod.compute.watchdog.main`) is written, within ``within_s``; one round trip. Its pid, or
        :class:`WatchdogNotRunning` with what its log says (a launch line exits 0 even when
        the interpreter is missing or the watchdog dies at import)."""
        tries = max(1, int(within_s / 0.25))
        script = (
            f"cd {self.q()} || exit 0\n"
            f"i=0; while [ $i -lt {tries} ]; do\n"
            f"  pid=$({guarded_read('head -c 20', 'watchdog.pid')} | tr -cd 0-9)\n"
            '  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && '
            f"{{ {guarded_read('head -c 4096', 'watchdog.log')} | grep -q ' watching '; }}; then\n"
            '    echo "LPWD alive $pid"; exit 0; fi\n'
            # dead before it wrote its pid (no interpreter, an import error), or after: no point waiting
            f"  lp=$({guarded_read('head -c 20', 'watchdog.launch')} | tr -cd 0-9)\n"
            '  [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null && break\n'
            '  [ -z "$pid" ] && [ -n "$lp" ] && ! kill -0 "$lp" 2>/dev/null && break\n'
            "  sleep 0.25; i=$((i+1)); done\n"
            f"echo LPWD dead; {guarded_read('tail -c 600', 'watchdog.log')}\n"
        )
        out = self.sh(script, timeout=within_s + 30, check=False).stdout.decode(errors="replace")
        head, _, log = out.partition("\n")
        if head.startswith("LPWD alive ") and head[len("LPWD alive "):].strip().isdigit():
            return int(head[len("LPWD alive "):].strip())
        raise WatchdogNotRunning(
            f"the watchdog did not start on the instance within {within_s:.0f} s"
            + (f"; its log says: {log.strip()[-400:]}" if log.strip() else "; it wrote nothing"),
            hint="the instance is destroyed now; check that its Python runs (pass --python PATH), "
                 "then run again")

    def start_job(self, files: dict[str, tuple[bytes, int]], argv: list[str]) -> None:
        """Write the last files (spec, secrets), then start the job detached: one round trip.
        With a volume, the job's caches point at it (HF_HOME, LORAPOD_CACHE_DIR)."""
        if self.cache_root:
            from lorapod.compute.runpod.volume_mount import cache_env

            argv = ["env", *(f"{k}={v}" for k, v in cache_env(self.cache_root).items()), *argv]
        self.put_files(files, then=f"{{ setsid nohup bash job.sh {shlex.join(argv)} > /dev/null 2>&1 < /dev/null & }}")

    def poll(self, metrics_offset: int, timeout: float = 30.0, limit: int = 1 << 20,
             watchdog_beat_s: float | None = None) -> JobStatus:
        """One round trip: heartbeat, job state, and at most ``limit`` new metrics bytes after
        ``metrics_offset`` (a bounded read, whatever the host wrote: rundir/metrics.py)."""
        script = (
            f"cd {self.q()} 2>/dev/null || {{ echo LPGONE; exit 0; }}\n"
            "touch HEARTBEAT\n"
            f"pid=$({guarded_read('head -c 20', 'job.pid')} | tr -cd 0-9); alive=0\n"
            '[ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && alive=1\n'
            '[ -z "$pid" ] && [ ! -f job.exit ] && alive=1\n'  # starting: not yet written its pid
            f'ex=$({guarded_read("head -c 200", "job.exit")} | tr -d "\\n")\n'
            # the watchdog is stopping the job: the status job.sh wrote first is not final until
            # the watchdog's "killed:" line replaces it (compute/watchdog.py kill_job), which
            # takes it at most 15 s; a marker a minute old is a watchdog that died meanwhile
            '[ -f job.killing ] && [ -n "$ex" ] && [ "${ex#killed:}" = "$ex" ] && '
            '[ -n "$(find job.killing -mmin -1 2>/dev/null)" ] && { ex=""; alive=1; }\n'
            f'stop=$({guarded_read("head -c 200", RUN_STOP)} | tr -d "\\n")\n'
            'echo "LP alive=$alive exit=$ex"\n'
            'echo "LP stop=$stop"\n'
            f"{watchdog_probe(watchdog_beat_s) if watchdog_beat_s is not None else ''}"
            f"{tail_after(RUN_METRICS, metrics_offset, limit)}\n"
        )
        out = self.sh(script, timeout=timeout).stdout
        head, _, rest = out.partition(b"\n")
        if head.startswith(b"LPGONE"):
            return JobStatus(alive=False, exit=None, gone=True)
        stop_line, _, rest = rest.partition(b"\n")
        wd = None
        if watchdog_beat_s is not None:
            wd_line, _, rest = rest.partition(b"\n")
            wd = parse_probe(wd_line)
        text = head.decode(errors="replace")
        alive = "alive=1" in text
        ex = text.split("exit=", 1)[1].strip() if "exit=" in text else ""
        stop = stop_line.decode(errors="replace").partition("stop=")[2].strip()
        return JobStatus(alive=alive, exit=ex or None, metrics=rest, stop=stop or None, watchdog=wd)

    def request_stop(self, reason: str) -> None:
        self.write_file(RUN_STOP, (reason + "\n").encode(), 0o644)

    def tail(self, rel: str, offset: int, limit: int, timeout: float = 30.0) -> bytes | None:
        """At most ``limit`` bytes of the work folder's ``rel`` after byte ``offset`` (b"" when it is
        not a regular file there); None when the work folder is gone (torn down). The one remote
        reader of a growing file: ``lorapod logs`` and the dashboard's live chart use it, and
        :meth:`poll` sends the same shell (:func:`~lorapod.compute.trust.tail_after`)."""
        out = self.sh(f"cd {self.q()} 2>/dev/null || {{ echo LPGONE; exit 0; }}; {tail_after(rel, offset, limit)}",
                      timeout=timeout, check=False).stdout
        return None if out.startswith(b"LPGONE") else out

    def pull(self, local_run: Path) -> SyncStats:
        return self.transport.pull(f"{self.dir}/run", local_run, excludes=PULL_EXCLUDES)

    def manifest(self, python: str) -> dict[str, list]:
        out = self.sh(f"{shlex.quote(python)} - {self.q('run')}", input=MANIFEST_PY.encode(), timeout=600)
        # the last JSON line: an interpreter that prints a banner first still works
        lines = [x for x in out.stdout.decode(errors="replace").splitlines() if x.startswith("{")]
        if not lines:
            raise RemoteError(f"the checksum list from the instance is empty ({python}): "
                              f"{out.stderr.decode(errors='replace')[-300:]}")
        return {k: v for k, v in json.loads(lines[-1]).items() if safe_relpath(k)}

    def mark_pulled(self) -> None:
        self.sh(f"touch {self.q('PULLED')}")

    def job_log_tail(self, lines: int = 30) -> str:
        out = self.sh(f"cd {self.q()} && {guarded_read(f'tail -n {lines}', 'job.log')}", check=False)
        return out.stdout.decode(errors="replace")

    def teardown(self) -> None:
        """Stop the job and the watchdog, remove the work folder. Idempotent. Used by the tests
        only: a run's own teardown goes through its provider's ``destroy`` (ssh.py runs the same
        :func:`teardown_script`)."""
        self.sh(teardown_script(self.dir), timeout=60)


def teardown_script(work_dir: str) -> str:
    d = shlex.quote(work_dir)
    pids = " ".join(f"$({guarded_read('head -c 20', f)} | tr -cd 0-9)" for f in ("job.pid", "watchdog.pid"))
    return (
        f"if [ -d {d} ]; then cd {d};\n"
        f"  for p in {pids}; do kill -TERM -- -\"$p\" 2>/dev/null; done\n"
        "  sleep 0.5\n"
        f"  for p in {pids}; do kill -KILL -- -\"$p\" 2>/dev/null; done\n"
        f"  cd ~ && rm -rf {d}; fi; echo LPOK\n"
    )


def local_manifest(root: Path) -> dict[str, list]:
    out: dict[str, list] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if not is_regular(p) or any(part.startswith((".tmp-", ".old-", ".rsync-partial", "__pycache__"))
                                  for part in rel.parts) or p.name == STOP or p.name.startswith("."):
            continue
        h = hashlib.sha256()
        with open(p, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        out[str(rel)] = [p.stat().st_size, h.hexdigest()]
    return out


def build_wheel(cache: Path) -> Path:
    """A wheel of this source tree, built once per content hash with ``pip wheel --no-deps``."""
    import lorapod

    if os.environ.get("LORAPOD_WHEEL"):
        wheel = Path(os.environ["LORAPOD_WHEEL"])
        if not wheel.is_file():
            raise RemoteError(f"LORAPOD_WHEEL={wheel} does not exist")
        return wheel
    pkg = Path(lorapod.__file__).resolve().parent
    root = pkg.parent.parent
    if not (root / "pyproject.toml").is_file():
        raise RemoteError("cannot build a wheel: lorapod is not running from a source tree",
                          hint="use --bootstrap source, or set LORAPOD_WHEEL to a lorapod wheel")
    h = hashlib.sha256((root / "pyproject.toml").read_bytes())
    for f in sorted(pkg.rglob("*")):
        if f.is_file() and "__pycache__" not in f.parts:
            h.update(str(f.relative_to(pkg)).encode())
            h.update(f.read_bytes())
    out = cache / h.hexdigest()[:16]
    found = sorted(out.glob("lorapod-*.whl"))
    if found:
        return found[0]
    out.mkdir(parents=True, exist_ok=True)
    # Build from a copy so the source tree gets no build/ or *.egg-info litter.
    with tempfile.TemporaryDirectory(prefix="lp-wheel-") as tmp:
        for name in ("pyproject.toml", "README.md", "LICENSE"):
            if (root / name).is_file():
                shutil.copy2(root / name, Path(tmp) / name)
        shutil.copytree(pkg, Path(tmp) / "src" / "lorapod", ignore=shutil.ignore_patterns("__pycache__"))
        proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                               "-w", str(out), tmp], capture_output=True, timeout=600, stdin=subprocess.DEVNULL)
    found = sorted(out.glob("lorapod-*.whl"))
    if proc.returncode != 0 or not found:
        raise RemoteError(f"pip wheel failed: {proc.stderr.decode(errors='replace')[-500:]}",
                          hint="pip install setuptools wheel, or use --bootstrap source")
    return found[0]
