"""The job wrapper that runs an external trainer inside lorapod's run-folder contract.

``python -m lorapod trainer-run TRAINER spec.yaml --run-dir run`` is the job command of a
``lorapod run --trainer`` (and of a local ``lorapod train --trainer``). It

1. builds the trainer's files and commands from the spec (refusing what it cannot honour),
2. sets the trainer up: clone at the pinned commit, install into this Python, the torch build
   (a failure is reported with the step, its last output lines and what to do next),
3. runs the prepare steps (downloads, caching) and the trainer, passing its output through to
   ``job.log`` and bridging its progress into ``run/metrics.jsonl``,
4. mirrors its checkpoints, state folders, samples and final LoRA into ``run/checkpoints/<key>/``,
   ``run/samples/`` and ``run/adapter/`` as they appear (hard links: no extra disk), so the
   controller pulls them like lorapod's own,
5. honours ``run/STOP``: asks the trainer to save (axolotl's trigger file) or waits for its next
   save, up to ``stop_wait_s``, then ends it (SIGINT, SIGTERM, SIGKILL to its process group) and
   exits 0, like ``lorapod train`` does;
6. on SIGTERM (a spot preemption: job.sh passes it on) does the same within
   :data:`PREEMPT_WAIT_S`, what is left of RunPod's 5 s: axolotl is asked to save at its next step,
   the others cannot save on demand and lose what they trained since their last save; then it
   returns ``preempted`` and ``trainer-run`` exits 75 (:data:`lorapod.errors.PREEMPTED_EXIT`).

A run folder that already holds checkpoints (``lorapod run --resume``) continues from the
newest through the trainer's own resume mechanism.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from lorapod.errors import LorapodError, RemoteError
from lorapod.fsutil import atomic_write_text
from lorapod.rundir.layout import CHECKPOINTS, METRICS, SAMPLES, STOP, checkpoint_name, checkpoint_step
from lorapod.trainers import prepare
from lorapod.trainers.base import Artifact, Layout, Trainer
from lorapod.trainers.job import Command, TrainerJob

LOG_TAIL_LINES = 25
#: After SIGTERM, how long to wait for a save the trainer was asked for (axolotl's trigger), before
#: ending it: RunPod's SIGKILL comes 5 s after its SIGTERM (its provider class: Billing.sigterm_grace_s)
PREEMPT_WAIT_S = 3.5
# The last line of a Python traceback: "AssertionError: when caching ...", "ValueError: ...".
_EXC_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?(?P<cls>[A-Z]\w*(?:Error|Exception))(?:: (?P<msg>.+))?$")
# accelerate's launcher re-raises a failed child as this (accelerate/commands/launch.py
# simple_launcher): the child's own exception, printed before it, is the trainer's reason.
_LAUNCHER_ERRORS = ("CalledProcessError",)
# the checkpoint key of the state a kohya trainer saves when it ends (KohyaOutputs.artifacts)
FINAL_STATE = "last"
# beside that state: the run's step it was saved at, as lorapod counted it ({"step": N}). Its name says
# no step, and musubi-tuner's state folder holds none (sd-scripts' has train_state.json): a resume
# from it would not know where the run stood (sd_scripts.resumed_step reads this)
FINAL_STATE_STEP = "step.json"


def trainer_reason(lines: list[str]) -> str | None:
    """The trainer's own reason for failing: the first exception line in its output that is not the
    launcher's re-raise (``AssertionError: when caching Text Encoder output, ...``)."""
    for line in lines:
        m = _EXC_LINE.match(line.strip())
        if m and m.group("cls") not in _LAUNCHER_ERRORS:
            return line.strip()[:2000]
    return None


class TrainerSetupFailed(RemoteError):
    """Cloning or installing the trainer on the instance failed."""


class TrainerFailed(RemoteError):
    """A prepare step or the trainer itself exited with an error."""


@dataclass
class Mirror:
    """Copies what the trainer writes into the run folder once it has stopped changing."""

    trainer: Trainer
    layout: Layout
    name: str
    run: Path
    keep_last: int
    step_offset: int = 0  # a resumed kohya job numbers its step saves from 0 again (TrainerJob.step_offset)
    protect: Callable[[], set[str]] | None = None  # checkpoints kept beyond keep_last (the quality pick)
    _seen: dict[Path, tuple] = field(default_factory=dict)
    done: set[Path] = field(default_factory=set)
    final_state: bool = False  # the trainer's final state was placed in this launch

    def sync(self, final: bool = False, settled: bool = False) -> list[tuple[str, str]]:
        """Mirror every artifact whose size and mtime held still since the last call (all of
        them when the trainer has ended: ``settled``; the final LoRA only when ``final``).
        Returns the (kind, key) of the checkpoints and state folders added."""
        added: list[tuple[str, str]] = []
        for art in self.trainer.artifacts(self.layout, self.name):
            if art.path in self.done or (art.kind == "final" and not final):
                continue
            sig = _signature(art.path)
            if not (final or settled) and self._seen.get(art.path) != sig:
                self._seen[art.path] = sig
                continue
            if self.step_offset and (step := checkpoint_step(art.key)) is not None:
                art = replace(art, key=checkpoint_name(step + self.step_offset))
            self._place(art)
            self.done.add(art.path)
            if art.kind in ("checkpoint", "state"):
                added.append((art.kind, art.key))
        if added:
            self._rotate()
        return added

    def _place(self, art: Artifact) -> None:
        if art.kind == "sample":
            _link_file(art.path, self.run / "samples" / art.path.name)
        elif art.kind == "final":
            _link_file(art.path, self.run / "adapter" / art.path.name)
        elif art.path.is_file():
            _link_file(art.path, self.run / CHECKPOINTS / art.key / art.path.name)
        else:  # a folder (a state folder, an HF checkpoint): copied whole, then renamed into place
            key_dir = self.run / CHECKPOINTS / art.key
            if art.kind == "state" and art.key == FINAL_STATE:  # an earlier launch's step is not this state's
                (key_dir / FINAL_STATE_STEP).unlink(missing_ok=True)
                self.final_state = True
            _link_tree(art.path, key_dir / "state" if art.kind == "state" else key_dir)

    def _rotate(self) -> None:
        """Keep the newest ``keep_last`` step/epoch checkpoints. The trainer's final state (``last``,
        the kohya trainers' ``NAME-state``) is not one of them: counting it would delete a step
        the trainer itself kept (sd-scripts keeps ``--save_last_n_steps`` saves *and* the final
        state; tests/recorded/sd15)."""
        kept = self.protect() if self.protect is not None else set()
        keys = sorted((p for p in (self.run / CHECKPOINTS).iterdir()
                       if p.is_dir() and not p.name.startswith(".") and p.name != FINAL_STATE and p.name not in kept),
                      key=lambda p: p.stat().st_mtime)
        for old in keys[: max(0, len(keys) - self.keep_last)]:
            shutil.rmtree(old, ignore_errors=True)


class _Scorer:
    """The quality autopilot's scoring of each mirrored checkpoint, one at a time in a thread of its
    own: the runner's loop goes on polling, so a STOP or a SIGTERM is acted on at once, however long a
    checkpoint takes to score. ``stop_reason`` is set once train.stop_when says stop. A scoring that
    fails is said and ends the scoring, never the run."""

    def __init__(self, judge, run_dir: Path, log: Callable[[dict], None], say: Callable[[str], None]) -> None:
        import queue

        self.judge, self.run_dir, self.log, self.say = judge, run_dir, log, say
        self.stop_reason: str | None = None
        self.jobs: queue.Queue = queue.Queue()
        threading.Thread(target=self._work, daemon=True, name="lorapod-quality").start()

    def submit(self, key: str, step: int, total: int | None) -> None:
        self.jobs.put((key, step, total))

    def drain(self) -> None:
        self.jobs.join()

    def _work(self) -> None:
        failed = False
        while True:
            key, step, total = self.jobs.get()
            try:
                if not failed and self.stop_reason is None:
                    why = self.judge.on_checkpoint(self.run_dir, key, step, total, self.log)
                    if why is not None:
                        self.stop_reason = why
            except Exception as exc:  # a scorer's failure is the scoring's, not the training's
                failed = True
                self.say(f"lorapod trainer-run: quality scoring stopped at {key}: {type(exc).__name__}: "
                         f"{str(exc)[:300]}")
            finally:
                self.jobs.task_done()


def _signature(path: Path) -> tuple:
    if path.is_file():
        st = path.stat()
        return (st.st_size, st.st_mtime_ns)
    return tuple(sorted((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in path.rglob("*") if p.is_file()))


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _link_tree(src: Path, dest: Path) -> None:
    tmp = dest.with_name(f".tmp-{dest.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src, tmp, copy_function=_link_or_copy)
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)


def _link_file(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        if os.path.samefile(src, dest):  # linked already: rename() onto the same file does nothing
            return
    tmp = dest.with_name(f".tmp-{dest.name}")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    _link_or_copy(str(src), str(tmp))
    os.replace(tmp, dest)


def newest_checkpoint(run: Path) -> Path | None:
    ckpts = [p for p in (run / CHECKPOINTS).glob("*") if p.is_dir() and not p.name.startswith(".")]
    return max(ckpts, key=lambda p: p.stat().st_mtime) if ckpts else None


def write_files(job: TrainerJob) -> None:
    for path, text in job.files.items():
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        if text.startswith("@link:"):  # a pulled checkpoint put back where the trainer resumes from
            _link_file(Path(text[len("@link:"):]), p)
        else:
            p.write_text(text, encoding="utf-8")


def _tail(lines: list[str]) -> str:
    return "\n".join(lines[-LOG_TAIL_LINES:])


class TrainerProcess:
    """One command, in its own process group, its output passed through and fed to a bridge."""

    def __init__(self, cmd: Command, on_text: Callable[[str], None] | None = None) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        argv = ["bash", "-c", cmd.argv[0]] if cmd.shell else cmd.argv
        try:
            self.proc = subprocess.Popen(argv, cwd=cmd.cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        except OSError as exc:
            raise TrainerFailed(f"{cmd.name}: cannot start {argv[0]}: {exc}") from exc
        self.lines: list[str] = []
        self.errors: list[str] = []  # exception lines, kept apart from the tail (a traceback can be long)
        self._partial = ""
        self._on_text = on_text
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        out = sys.stdout.buffer
        while chunk := self.proc.stdout.read1(65536):
            out.write(chunk)
            out.flush()
            text = chunk.decode(errors="replace")
            *done, self._partial = (self._partial + text).replace("\r", "\n").split("\n")
            if len(self._partial) > 65536:  # a line without an end is still bounded
                done, self._partial = [*done, self._partial], ""
            self._lines(done)
            if self._on_text:
                self._on_text(text)
        self._lines([self._partial])
        self._partial = ""

    def _lines(self, done: list[str]) -> None:
        """Whole lines only (a chunk can end mid-line): the tail, and exception lines kept apart."""
        new = [ln for ln in done if ln.strip()]
        self.lines = (self.lines + new)[-LOG_TAIL_LINES:]
        self.errors = (self.errors + [ln for ln in new if _EXC_LINE.match(ln.strip())])[:20]

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait_output(self) -> None:
        self._reader.join(timeout=10)

    def end(self, grace_s: float = 15.0) -> int:
        """SIGINT, then SIGTERM, then SIGKILL to the whole process group."""
        for sig, wait in ((signal.SIGINT, grace_s), (signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
            if self.proc.poll() is not None:
                break
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(wait)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # anything it left behind in its group
        self.wait_output()
        return self.proc.wait()


def _forwarded_trackers(spec, trainer: Trainer, run_dir: Path) -> list:
    """Trackers fed from the bridged metrics, for a trainer that cannot log to them itself
    (its ``forwarded_trackers``: ai-toolkit and W&B, trainers/ai_toolkit.py says why)."""
    if not trainer.forwarded(spec):
        return []
    from lorapod.engine.trackers import WandbTracker
    from lorapod.rundir import RunDir
    from lorapod.spec import redact
    from lorapod.trainers.tracking import run_name

    run = RunDir(run_dir)
    return [WandbTracker(spec.tracking.wandb, run_dir, redact(spec.model_dump(mode="json")), run_name(spec), run.event)]


def run_trainer(spec, trainer_name: str, run_dir: Path, work: Path, *, python: str = sys.executable,
                src: str | None = None, stop_wait_s: float = 240.0, poll_s: float = 1.0,
                say: Callable[[str], None] = print, judge=None) -> str:
    """Run the whole job; returns ``done``, ``stopped`` (run/STOP, or train.stop_when) or ``preempted``
    (SIGTERM). Raises with the reason on failure. ``judge``: the quality autopilot scoring each
    mirrored checkpoint (default: engine/external_judge.py ``external_autopilot`` for the spec)."""
    term = [False]
    old_term = None
    # A job started in the background by a shell has SIGINT ignored, and an ignored signal stays
    # ignored across exec: catching it here makes the trainer's own Python get the default back,
    # so SIGINT on STOP reaches it as KeyboardInterrupt.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
        old_term = signal.signal(signal.SIGTERM, lambda *_: term.__setitem__(0, True))
    try:
        return _run(spec, trainer_name, run_dir, work, python, src, stop_wait_s, poll_s, say, term, judge)
    finally:
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)


def _run(spec, trainer_name: str, run_dir: Path, work: Path, python: str, src: str | None, stop_wait_s: float,
         poll_s: float, say: Callable[[str], None], term: list[bool], judge=None) -> str:
    from lorapod.engine.metrics import MetricsWriter

    run_dir = Path(run_dir)
    for sub in (CHECKPOINTS, SAMPLES):
        (run_dir / sub).mkdir(parents=True, exist_ok=True)
    layout = Layout(str(Path(work).resolve()), python)
    trainer, job = prepare(spec, trainer_name, layout)
    if src and not ("://" in src or src.endswith(".git")):
        job = _with_src(trainer, spec, layout, src)
    ckpt = newest_checkpoint(run_dir)
    resume_step = checkpoint_step(ckpt.name) if ckpt is not None else None
    if ckpt is not None:
        trainer.resume(job, ckpt.resolve())
        say(f"lorapod trainer-run: resuming {trainer.title} from {ckpt.name}"
            + (f" (step {job.step_offset}: its steps count on from there)" if job.step_offset else ""))
        if trainer.resume_kind == "state":
            _clear_outputs(trainer, layout, job.output_name)
        resume_step = job.step_offset or resume_step
    write_files(job)
    for d in (layout.out, layout.logs, layout.models):
        Path(d).mkdir(parents=True, exist_ok=True)
    stop_file = run_dir / STOP

    for cmd in trainer.setup_commands(layout, python, src):
        if stop_file.exists() or term[0]:
            return "preempted" if term[0] else "stopped"
        say(f"lorapod trainer-run: setup: {cmd.name}")
        p = TrainerProcess(cmd)
        while p.poll() is None:
            time.sleep(0.2)
            if stop_file.exists() or term[0]:  # nothing to save yet: end the install and stop
                p.end(grace_s=0.5 if term[0] else 5.0)
                return "preempted" if term[0] else "stopped"
        p.wait_output()
        if p.proc.returncode != 0:
            raise TrainerSetupFailed(
                f"{trainer.title} setup failed at '{cmd.name}' (exit {p.proc.returncode}):\n{_tail(p.lines)}",
                hint=_setup_hint(trainer, cmd))

    # on resume, lines logged after the checkpoint go: the trainer logs those steps again
    metrics = MetricsWriter(run_dir / METRICS, resume_step=resume_step,
                            trackers=_forwarded_trackers(spec, trainer, run_dir))
    if judge is None:
        from lorapod.engine.external_judge import external_autopilot

        judge = external_autopilot(spec, run_dir, say)
    mirror = Mirror(trainer, layout, job.output_name, run_dir, spec.save.keep_last, job.step_offset,
                    protect=judge.keep if judge is not None else None)
    bridge = trainer.metrics_parser(job)
    lock = threading.Lock()
    last_step = [0]
    total = [spec.train.max_steps]

    def log(records: list[dict]) -> None:
        for rec in records:
            metrics.log(rec)
            last_step[0] = max(last_step[0], int(rec.get("step", 0)))
            if isinstance(rec.get("total_steps"), int):
                total[0] = rec["total_steps"]

    def locked_log(rec: dict) -> None:
        with lock:
            metrics.log(rec)

    scorer = _Scorer(judge, run_dir, locked_log, say) if judge is not None else None

    def judged(added: list[tuple[str, str]]) -> None:
        """Each checkpoint just mirrored goes to the quality autopilot, scored in its own thread."""
        for kind, key in added:
            if scorer is not None and kind == "checkpoint":
                step = checkpoint_step(key)
                scorer.submit(key, step if step is not None else last_step[0], total[0])

    def on_text(text: str) -> None:
        with lock:
            log(bridge.feed(text))

    try:
        for i, cmd in enumerate(job.commands):
            if term[0]:  # SIGTERM between two commands (a prepare step just ended)
                return "preempted"
            last = i == len(job.commands) - 1
            say(f"lorapod trainer-run: {cmd.name}")
            p = TrainerProcess(cmd, on_text if cmd.phase == "train" else None)
            stopping_since: float | None = None
            preempted_since: float | None = None
            before: set[str] = set()
            while p.poll() is None:
                time.sleep(min(poll_s, 0.25) if term[0] else poll_s)
                with lock:
                    log(bridge.poll())
                added = mirror.sync()
                saved = [key for kind, key in added if kind == trainer.resume_kind]
                if cmd.phase == "train":
                    judged(added)
                why = scorer.stop_reason if scorer is not None else None
                if why is not None:  # train.stop_when: the run ends at the checkpoint it judged
                    p.end()
                    with lock:
                        log(bridge.flush() + bridge.poll())
                    mirror.sync(settled=True)
                    say(f"lorapod trainer-run: train.stop_when at step {last_step[0]}: {why}")
                    return "stopped"
                if term[0] and preempted_since is None:
                    preempted_since = time.monotonic()
                    before = {a.key for a in trainer.artifacts(layout, job.output_name) if a.kind == trainer.resume_kind}
                    trigger = trainer.stop_trigger(layout)
                    if cmd.phase != "train" or trigger is None:
                        break  # it cannot save on demand: what it saved last is what resumes
                    trigger.parent.mkdir(parents=True, exist_ok=True)
                    trigger.touch()
                    say(f"lorapod trainer-run: SIGTERM: asking {trainer.title} to save within {PREEMPT_WAIT_S:g} s")
                elif preempted_since is not None:
                    if set(saved) - before or time.monotonic() - preempted_since > PREEMPT_WAIT_S:
                        break
                    continue
                if stop_file.exists() and stopping_since is None:
                    stopping_since = time.monotonic()
                    before = {a.key for a in trainer.artifacts(layout, job.output_name) if a.kind == trainer.resume_kind}
                    trigger = trainer.stop_trigger(layout)
                    if cmd.phase != "train":
                        break
                    if trigger is not None:
                        trigger.parent.mkdir(parents=True, exist_ok=True)
                        trigger.touch()
                    say(f"lorapod trainer-run: STOP: waiting up to {stop_wait_s:.0f} s for {trainer.title} to save")
                elif stopping_since is not None and (set(saved) - before
                                                      or time.monotonic() - stopping_since > stop_wait_s):
                    break
            if preempted_since is not None:
                p.end(grace_s=0.2)
                with lock:
                    log(bridge.flush() + bridge.poll())
                mirror.sync(settled=True)
                say(f"lorapod trainer-run: preempted (SIGTERM) at step {last_step[0]}; newest save: "
                    f"{newest_checkpoint(run_dir).name if newest_checkpoint(run_dir) else 'none'}")
                return "preempted"
            if stopping_since is not None and (p.poll() is None or p.poll() != 0 or not last):
                p.end()
                with lock:
                    log(bridge.flush() + bridge.poll())
                mirror.sync(settled=True)
                say(f"lorapod trainer-run: STOP honoured at step {last_step[0]}")
                return "stopped"
            p.wait_output()
            rc = p.proc.wait()
            with lock:
                log(bridge.flush() + bridge.poll())
            if rc != 0:
                reason = trainer_reason(p.errors)
                head = f"{trainer.title} stopped with: {reason}\n" if reason else ""
                raise TrainerFailed(f"{head}{trainer.title}: '{cmd.name}' exited with {rc}:\n{_tail(p.lines)}",
                                    hint=trainer.fix_for(reason) or "the trainer's own message is above (job.log); "
                                         "fix the spec or the data, then `lorapod run --resume JOB`")
        judged(mirror.sync(final=True))
        if mirror.final_state and last_step[0]:  # every step's record is in: the state's step is the last
            atomic_write_text(run_dir / CHECKPOINTS / FINAL_STATE / FINAL_STATE_STEP,
                              json.dumps({"step": last_step[0]}) + "\n")
        if scorer is not None:
            scorer.drain()
            judge.finish(run_dir, locked_log)  # what waited for the GPU while the trainer ran
    finally:
        metrics.close()
    if not any((run_dir / "adapter").glob("*")):
        raise TrainerFailed(f"{trainer.title} finished but wrote no final LoRA where lorapod expects it "
                            f"({job.output_dir}/{job.output_name}…)", hint="see job.log")
    say(f"lorapod trainer-run: done at step {last_step[0]}; adapter in {run_dir / 'adapter'}")
    return "done"


def _clear_outputs(trainer: Trainer, layout: Layout, name: str) -> None:
    """Before a kohya trainer resumes in the same work folder: its earlier saves are in the run
    folder already (hard links), and the resumed trainer numbers its saves from 0 again, so it
    would write into those very files (truncating them: the run's checkpoints would change under
    their names). Unlinking its copies keeps the run folder's."""
    for art in trainer.artifacts(layout, name):
        if art.kind == "sample":
            continue
        if art.path.is_dir():
            shutil.rmtree(art.path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                art.path.unlink()


def _with_src(trainer: Trainer, spec, layout: Layout, src: str) -> TrainerJob:
    """An existing checkout on this machine replaces the clone: commands run from there."""
    src_path = str(Path(src).resolve())
    job = trainer.build(spec, layout)
    for cmd in job.commands:
        cmd.argv = [a.replace(layout.src, src_path) for a in cmd.argv]
        if cmd.cwd == layout.src:
            cmd.cwd = src_path
    trainer.check(job)
    return job


def _setup_hint(trainer: Trainer, cmd: Command) -> str:
    if cmd.name.startswith("clone"):
        return (f"the instance could not fetch {trainer.repo} at {trainer.commit}: check its network, or pass "
                "--trainer-src with a mirror URL or a checkout already on the instance")
    if cmd.name.startswith("torch"):
        return f"install {trainer.torch} into the image, or pick an image with a CUDA PyTorch build"
    return (f"the trainer's requirements did not install into {cmd.argv[0]}; use an image with a matching "
            "PyTorch/CUDA, or --trainer-src with a checkout whose requirements are already installed")


def main_error(exc: LorapodError) -> int:
    print(f"lorapod trainer-run: error: {exc.message}", file=sys.stderr)
    if exc.hint:
        print(f"  -> {exc.hint}", file=sys.stderr)
    return 3
