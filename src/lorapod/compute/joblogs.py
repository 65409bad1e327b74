"""What ``lorapod logs`` shows, as library functions: a remote job's metrics and logs, live from
its instance (across the instances of a job on spot) and then from the pulled run folder, and a
local run folder's, followed while a `lorapod train` holds it. Every line comes once, tagged with
the file it came from (``[metrics.jsonl] ...``); what a host sends is read in bounded chunks."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

from lorapod.compute.jobs import Reach, find_job, reach
from lorapod.compute.remote import RUN_METRICS
from lorapod.compute.transport import ConnectionLost
from lorapod.rundir.layout import METRICS
from lorapod.rundir.metrics import MetricsFeed
from lorapod.store.identity import controller_alive
from lorapod.store.ledger import JobRow, Ledger

#: What one `lorapod logs` poll reads of each file on the instance: the host decides their size.
LOG_CHUNK = 1 << 20


def local_run_logs(run_dir: Path, follow: bool, poll_s: float = 1.0) -> Iterator[str]:
    """Lines of a local run folder's metrics.jsonl, events.log and job.log (tagged as
    :func:`follow_logs` tags them); with ``follow``, new lines as they come while a process holds
    the folder's writer lock (a `lorapod train` running), then the rest."""
    from lorapod.rundir import LOCK_NAME
    from lorapod.rundir.layout import METRICS

    offsets = {METRICS: 0, "events.log": 0, "job.log": 0}

    def busy() -> bool:
        import fcntl
        import os

        try:
            fd = os.open(run_dir / LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return True
        finally:
            os.close(fd)
        return False

    def read(final: bool) -> Iterator[str]:
        for name in offsets:
            p = run_dir / name
            if not p.is_file() or p.is_symlink():
                continue
            with open(p, "rb") as fh:
                while True:
                    fh.seek(offsets[name])
                    data = fh.read(LOG_CHUNK)
                    nl = data.rfind(b"\n") + 1  # whole lines; a line longer than a chunk comes in pieces
                    cut = (nl or len(data)) if len(data) == LOG_CHUNK else len(data) if final else nl
                    if not cut:
                        break
                    offsets[name] += cut
                    yield from (f"[{name}] {line}" for line in data[:cut].decode(errors="replace").splitlines())

    while follow and busy():
        yield from read(final=False)
        time.sleep(poll_s)
    yield from read(final=True)


def follow_logs(ledger: Ledger, job_id: str, follow: bool, poll_s: float = 2.0,
                reconnect_s: float = 600.0) -> Iterator[str]:
    """Lines of metrics.jsonl and job.log: live from the instance while the job runs (riding out
    dropped connections), then the rest from the pulled copies, so every line comes exactly once.

    Following a job on spot, the instance can change under it: a preempted one stops answering,
    the controller rents the next and resumes there. The follower waits for the job's next live
    instance (while the job runs and its controller lives), says the move in a ``[lorapod]`` line,
    and reads that instance's own logs from their start; its metrics.jsonl begins with the lines
    pushed home before (cut at the newest whole checkpoint), so a metrics line is shown only once
    its step is past the last one already shown: every step once, in order (the steps run again
    after the checkpoint were shown from the instance before)."""
    job = find_job(ledger, job_id)
    run_dir = Path(job.run_dir)
    offsets = {METRICS: 0, "job.log": 0, "watchdog.log": 0}
    remote_rel = {METRICS: RUN_METRICS, "job.log": "job.log", "watchdog.log": "watchdog.log"}
    steps: dict[str, int | None] = {"last": None,  # the newest metrics step shown
                                    "pass_to": None}  # after a move: lines up to this step were shown

    def step_of(line: str) -> int | None:
        """The line's step by the one metrics reader's rules (bounded, validated; a hostile line
        has none), with no floor: a move starts the instance's file from its beginning."""
        rec = MetricsFeed().accept(line)
        return rec["step"] if rec is not None else None

    def new_metrics(line: str) -> bool:
        """Whether a metrics line is shown: always, unless the follower moved and has not yet read
        past the step it had shown on the instance before."""
        step = step_of(line)
        if steps["pass_to"] is not None:
            if step is None or step <= steps["pass_to"]:
                return False
            steps["pass_to"] = None  # caught up: from here on the file goes on as the job writes it
        if step is not None:
            steps["last"] = max(steps["last"] or 0, step)
        return True

    def lines(name: str, data: bytes) -> list[str]:
        cut = data.rfind(b"\n")
        if cut < 0:
            if len(data) >= LOG_CHUNK:  # one line longer than a whole chunk: skip it, say so
                offsets[name] += len(data)
                return [f"[{name}] (a line longer than {LOG_CHUNK >> 20} MiB, not shown)"]
            return []
        offsets[name] += cut + 1
        out = data[: cut + 1].decode(errors="replace").splitlines()
        if name == METRICS:
            out = [x for x in out if new_metrics(x)]
        return [f"[{name}] {line}" for line in out]

    def running(j: JobRow) -> bool:
        return j.state in ("starting", "running", "stopping")

    def wait_for_next(j: JobRow) -> bool:
        """Nothing to read now: wait for the job's next instance while it runs and its controller
        lives (spot recovery); False when there is nothing more to follow live."""
        return follow and running(j) and controller_alive(j.controller)

    r: Reach | None = None
    deadline = time.monotonic() + reconnect_s
    try:
        while True:
            j = find_job(ledger, job_id)
            live = [i for i in ledger.job_instances(j.id) if i.live and i.ssh_host]
            if not running(j) or (not live and not wait_for_next(j)):
                break
            if not live:  # between instances: the husk is gone, the next one is not up yet
                time.sleep(poll_s)
                continue
            if r is None or r.row.id != live[-1].id:
                moved = r is not None
                if r is not None:
                    r.close()
                r = reach(ledger, j)
                if r is None:
                    continue
                if moved:
                    where = r.row.provider_id or r.row.id
                    yield (f"[lorapod] the job moved to instance {where}"
                           f"{f' ({r.row.gpu_name})' if r.row.gpu_name else ''}; following it there")
                    offsets.update({name: 0 for name in offsets})  # that instance's own files
                    steps["pass_to"] = steps["last"]
                deadline = time.monotonic() + reconnect_s
            try:
                gone = False
                for name, rel in remote_rel.items():
                    out = r.work.tail(rel, offsets[name], LOG_CHUNK)
                    if out is None:
                        gone = True
                        break
                    yield from lines(name, out)
                if gone and not wait_for_next(find_job(ledger, job_id)):
                    break  # torn down (by the watchdog, or `lorapod down`)
                if not gone:
                    deadline = time.monotonic() + reconnect_s
            except ConnectionLost:
                j = find_job(ledger, job_id)
                if not controller_alive(j.controller) or (time.monotonic() > deadline and not wait_for_next(j)):
                    break  # unreachable and nobody is following it: show what was pulled
            if not follow:
                return
            time.sleep(poll_s)
    finally:
        if r is not None:
            r.close()
    for name in offsets:  # the job is over: the rest is in the pulled run folder
        p = run_dir / name
        if p.is_file():
            with open(p, "rb") as fh:
                fh.seek(offsets[name])
                data = fh.read()
                yield from lines(name, data if data.endswith(b"\n") or not data else data + b"\n")
