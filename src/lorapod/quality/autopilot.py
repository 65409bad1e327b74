"""What runs at every checkpoint, on the machine that trains: score, record, decide, maybe stop.

:class:`Autopilot` is the one object the engine's loop (engine/loop.py ``on_checkpoint``) and the
trainer runner call. It keeps nothing that matters in memory: every checkpoint's record is appended
to ``quality/scores.jsonl`` and the decision rewritten to ``quality/pick.json`` before it returns,
so a spot preemption loses at most the checkpoint being scored, and the resumed run (on another
instance, from the pulled run folder) reads the scores so far and counts its plateau on from there.

A *scoring* (:class:`ImageScoring`, :class:`LLMScoring`) turns the model as it is now into one
record; the autopilot does the bookkeeping around it, which is the same for every kind of run.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from lorapod.quality import decide
from lorapod.quality.measure import References, Render, embed_references, prompt_numbers, strength_entry
from lorapod.quality.prompts import ScorePrompt
from lorapod.quality.scorers import Scorers
from lorapod.rundir import quality as files
from lorapod.rundir.layout import METRICS, checkpoint_name

#: Thumbnails of the scored images (longest side, JPEG): enough to look at, a few KB each.
THUMB_PX = 256


class Scoring(Protocol):
    kind: str

    def measure(self, step: int) -> dict[str, Any]: ...


def _thumb(img: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    im = img.convert("RGB")
    im.thumbnail((THUMB_PX, THUMB_PX))
    im.save(path, quality=85)


class ImageScoring:
    """Images (and video frames) drawn by the base and by the checkpoint at each strength, at the
    same seeds, scored against the held-out references (measure.py)."""

    kind = "image"

    def __init__(self, root: Path, scorers: Scorers, prompts: Sequence[ScorePrompt], strengths: Sequence[float],
                 references: Sequence[Any], training: Sequence[Any],
                 render: Callable[[ScorePrompt, float], Render], device: Any = "cpu") -> None:
        self.root, self.scorers, self.prompts = Path(root), scorers, list(prompts)
        self.strengths = [float(s) for s in strengths]  # never `s or 1.0`: 0 would become 1
        self.render, self.device = render, device
        self.refs: References = embed_references(scorers, references, training)
        self.base: list[dict[str, Any]] | None = None

    def fingerprint(self) -> dict[str, Any]:
        return {"prompts": [[p.prompt, p.seed, p.width, p.height, p.steps, p.scale] for p in self.prompts],
                "models": self.scorers.names(), "references": self.refs.count}

    def _base_row(self) -> list[dict[str, Any]]:
        """The base model's numbers (strength 0: the LoRA off), drawn once and kept in base.json."""
        if self.base is not None:
            return self.base
        cached = files.read_json(self.root, files.BASE)
        if cached and cached.get("fingerprint") == self.fingerprint() and isinstance(cached.get("prompts"), list) \
                and len(cached["prompts"]) == len(self.prompts) and all(isinstance(x, dict) for x in cached["prompts"]):
            self.base = cached["prompts"]
            return self.base
        rows = []
        for i, sp in enumerate(self.prompts):
            frames = self.render(sp, 0.0)
            _thumb(frames[len(frames) // 2], files.folder(self.root) / files.RENDERS / "base" / f"p{i:02d}.jpg")
            rows.append(prompt_numbers(self.scorers, self.refs, sp, frames))
        files.write_json(self.root, files.BASE, {"fingerprint": self.fingerprint(), "prompts": rows,
                                                 "strength": 0.0, "note": "the base model: the LoRA disabled"})
        self.base = rows
        return rows

    def measure(self, step: int) -> dict[str, Any]:
        self.scorers.to(self.device)
        try:
            base = self._base_row()
            out: dict[str, Any] = {}
            for s in self.strengths:
                nums = []
                for i, sp in enumerate(self.prompts):
                    frames = self.render(sp, s)
                    _thumb(frames[len(frames) // 2],
                           files.folder(self.root) / files.RENDERS / checkpoint_name(step) / f"p{i:02d}-s{s:g}.jpg")
                    nums.append(prompt_numbers(self.scorers, self.refs, sp, frames))
                out[f"{s:g}"] = strength_entry(self.prompts, base, nums)
        finally:
            self.scorers.to("cpu")
        return {"kind": self.kind, "strengths": out, "models": self.scorers.names(),
                "references": self.refs.count,
                "prompts": [{"prompt": p.prompt, "seed": p.seed, "leakage": p.leakage} for p in self.prompts]}


class LLMScoring:
    """Held-out loss and greedy answers to held-out conversations, against the base's."""

    kind = "llm"

    def __init__(self, root: Path, evaluate: Callable[[bool], float | None],
                 answer: Callable[[list[list[dict[str, Any]]], bool], list[str]],
                 examples: Sequence[tuple[list[dict[str, Any]], str]], base_loss: float | None = None) -> None:
        self.root, self.evaluate, self.answer, self.examples = Path(root), evaluate, answer, list(examples)
        self._base_loss = base_loss
        self.base: dict[str, Any] | None = None

    def _base_row(self) -> dict[str, Any]:
        from lorapod.quality.llm import answers_row

        if self.base is not None:
            return self.base
        fp = [m[-1].get("content", "") for m, _ in self.examples]
        cached = files.read_json(self.root, files.BASE)
        if cached and cached.get("fingerprint") == fp:
            self.base = cached
            return cached
        loss = self._base_loss if self._base_loss is not None else self.evaluate(False)
        answers = self.answer([m for m, _ in self.examples], False)
        row = {"fingerprint": fp, "val_loss": loss, **answers_row(answers, [r for _, r in self.examples]),
               "answers": answers[:64], "note": "the base model: the adapter disabled, greedy answers"}
        files.write_json(self.root, files.BASE, row)
        self.base = row
        return row

    def measure(self, step: int) -> dict[str, Any]:
        from lorapod.quality.llm import llm_entry

        base = self._base_row()
        loss = self.evaluate(True)
        answers = self.answer([m for m, _ in self.examples], True)
        entry = llm_entry(loss, base, answers, [r for _, r in self.examples])
        samples = [{"prompt": m[-1].get("content", "")[:500], "reference": r[:500], "base": b[:500], "answer": a[:500]}
                   for (m, r), a, b in zip(self.examples[:4], answers, base.get("answers") or [""] * 4, strict=False)]
        return {"kind": self.kind, "strengths": {"1": entry},
                "models": {"loss": "held-out loss (the model itself)",
                           "answers": "token F1 and exact match against the reference replies (SQuAD normalisation)"},
                "references": len(self.examples), "samples": samples}


class Autopilot:
    """Records, decides and stops; ``scoring`` None: the autopilot is off (``off`` says why), and the
    run says so once."""

    def __init__(self, spec: Any, root: Path, scoring: Scoring | None, off: str | None = None,
                 log: Callable[[str], None] = print, event: Callable[[str], None] | None = None,
                 metrics: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.spec, self.root, self.scoring, self.off = spec, Path(root), scoring, off
        self.log, self.event = log, event or (lambda m: None)
        self.metrics = metrics or (lambda r: None)
        self.records = files.read_scores(self.root)
        self._last_end: tuple[float, int] | None = None
        prior = files.read_json(self.root, files.PICK) or {}
        self.picked: str | None = prior.get("checkpoint") if isinstance(prior.get("checkpoint"), str) else None

    @property
    def decides(self) -> bool:
        return self.scoring is not None and self.off is None

    def start(self) -> None:
        """Said once, before training: what is scored with what, or why nothing is."""
        if self.scoring is None:
            msg = f"quality autopilot off: {self.off}"
            files.write_json(self.root, files.PICK, decide.pick(self.records, self.off or "off"))
        elif self.off:
            msg = f"quality: scoring every checkpoint, but the autopilot does not pick or stop: {self.off}"
        else:
            rule = self.spec.train.stop_when
            msg = "quality autopilot on: every checkpoint scored against the base" + (
                f"; train.stop_when: {rule.model_dump(exclude_none=True)}" if rule is not None else "")
        if self.records:
            msg += f" ({len(self.records)} checkpoint(s) scored before this resume, from quality/scores.jsonl)"
        self.log(msg)
        self.event(msg)

    def scored(self, step: int) -> bool:
        return any(r.get("step") == step for r in self.records)

    def keep(self) -> set[str]:
        """The checkpoint folders save.keep_last must not delete: the pick so far."""
        return {self.picked} if self.picked else set()

    def on_checkpoint(self, step: int, total_steps: int,
                      metrics: Callable[[dict[str, Any]], None] | None = None, label: str | None = None) -> str | None:
        """Score the model as it is at ``step`` (just saved), record it, decide; the reason to stop
        training now, or None. A step already scored (a resume from it) is not scored again.
        ``metrics``: where the score's line goes (the run's metrics.jsonl, for the dashboard);
        ``label``: the checkpoint's folder when it is not ``step-N`` (an external trainer's ``epoch-2``)."""
        if metrics is not None:
            self.metrics = metrics
        stop = files.read_json(self.root, files.STOPPED)
        if stop is not None and stop.get("step") == step and isinstance(stop.get("reason"), str):
            return str(stop["reason"])  # decided before a preemption cut the run short
        if self.scoring is None or self.scored(step):
            self._last_end = (time.monotonic(), step)
            return None
        t0 = time.monotonic()
        try:
            rec = self.scoring.measure(step)
        except (RuntimeError, OSError, ValueError, KeyError, IndexError) as exc:  # out of memory included
            self.fail(step, exc)
            return None
        rec.update(step=step, checkpoint=label or checkpoint_name(step), seconds=round(time.monotonic() - t0, 3))
        files.append_score(self.root, rec)
        self.records = sorted([r for r in self.records if r.get("step") != step] + [rec], key=lambda r: r["step"])
        decision = decide.pick(self.records, self.off)
        files.write_json(self.root, files.PICK, decision)
        self.picked = decision.get("checkpoint")
        self._say(rec, decision)
        reason = self._stop_reason() if step < total_steps else None  # at the last step there is nothing to save
        if reason is not None:
            files.write_json(self.root, files.STOPPED, self._saved(step, total_steps, reason, label))
        self._last_end = (time.monotonic(), step)
        return reason

    def fail(self, step: int, exc: BaseException) -> None:
        """A scoring that fails (a scorer out of GPU memory, a broken image) ends the scoring, never the
        training: said, and the autopilot off from here (the scores so far stay, and the decision from them)."""
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        self.off = f"scoring failed at {checkpoint_name(step)} ({type(exc).__name__}: {first}); no more checkpoints scored"
        self.scoring = None
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except ImportError:
            pass
        files.write_json(self.root, files.PICK, decide.pick(self.records, self.off))
        self.picked = None
        self.log(f"quality: {self.off}")
        self.event(f"quality: {self.off}")

    def _say(self, rec: dict[str, Any], decision: dict[str, Any]) -> None:
        best = decide.best_of(rec)
        entry = rec["strengths"].get(f"{best.strength:g}") if best else None
        parts = []
        if entry is not None:
            for key, label in (("fidelity", "fidelity"), ("adherence", "adherence"), ("leakage", "leakage"),
                               ("loss_gain", "loss gain"), ("f1_delta", "answer F1")):
                v = entry.get(key)
                if isinstance(v, int | float):
                    parts.append(f"{label} {v:+.4f}")
        copies = [k for k, e in rec["strengths"].items() if isinstance(e, dict) and e.get("memorised")]
        line = (f"quality {rec['checkpoint']}: " + (f"score {best.score:+.4f} ± {best.se:.4f} at strength "
                                                    f"{best.strength:g} ({', '.join(parts)})" if best else "no score")
                + (f"; copies a training image at strength {', '.join(copies)}" if copies else "")
                + (f"; pick so far: {decision['checkpoint']} at {decision['strength']:g}"
                   if decision.get("checkpoint") else "") + f" [{rec['seconds']:.1f} s]")
        self.log(line)
        self.event(line)
        row: dict[str, Any] = {"step": rec["step"], "event": "quality", "quality_seconds": rec["seconds"]}
        if best is not None:
            row.update(quality_score=best.score, quality_strength=best.strength)
            if entry is not None:
                row.update({f"quality_{k}": entry[k] for k in ("fidelity", "adherence", "leakage", "loss_gain", "f1_delta")
                            if isinstance(entry.get(k), int | float)})
        self.metrics(row)

    def _stop_reason(self) -> str | None:
        rule = self.spec.train.stop_when
        if rule is None or not self.decides:
            return None
        return decide.stop_reason(self.records, rule.plateau, rule.target, rule.min_delta, rule.min_checkpoints)

    def _seconds_per_step(self, step: int) -> float | None:
        from lorapod.rundir.metrics import number, read_records

        times = [t for r in read_records(self.root / METRICS, tail_bytes=512 << 10)
                 if "loss" in r and (t := number(r.get("step_time_s"))) is not None and t > 0]
        if times:
            return statistics.median(times[-400:])
        if self._last_end is not None and step > self._last_end[1]:  # an external trainer: wall clock
            return (time.monotonic() - self._last_end[0]) / (step - self._last_end[1])
        return None

    def _saved(self, step: int, total_steps: int, reason: str, label: str | None = None) -> dict[str, Any]:
        left = max(0, total_steps - step)
        per_step = self._seconds_per_step(step)
        steps = [int(r["step"]) for r in self.records]
        gap = statistics.median([b - a for a, b in itertools.pairwise(steps)]) if len(steps) > 1 else None
        scoring_s = statistics.mean(float(r.get("seconds") or 0.0) for r in self.records)
        ckpts_left = int(left // gap) if gap else 0
        secs = left * per_step + ckpts_left * scoring_s if per_step is not None else None
        out = {"step": step, "checkpoint": label or checkpoint_name(step), "reason": reason, "planned_steps": total_steps,
               "steps_saved": left, "seconds_per_step": per_step, "checkpoints_saved": ckpts_left,
               "scoring_seconds_per_checkpoint": scoring_s, "seconds_saved": secs}
        msg = files.saved_line(out, getattr(self.spec.compute, "usd_per_hour", None))
        self.log(msg)
        self.event(msg)
        return out
