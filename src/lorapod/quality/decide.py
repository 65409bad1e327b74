"""From the scores to one decision: the composite score, the pick, and when to stop.

Pure functions of the records in ``quality/scores.jsonl`` (rundir/quality.py), so the engine, the
trainer runner, ``lorapod eval`` and a resumed run after a preemption all decide the same way from
the same file.

**The score** of a checkpoint at a strength, every part a difference from the base model at the
same seeds and prompts (measure.py, llm.py):

* images: ``fidelity + W_ADHERENCE * min(0, adherence) - W_LEAKAGE * leakage``. Fidelity (the
  likeness to the held-out references, mean over DINOv2, CLIP/SigLIP image and face scores) is what
  a LoRA is for; adherence (CLIP text-image to the prompt's scene) only counts against it where the
  LoRA made the model follow prompts worse than the base did; leakage (how far images of prompts
  without the trigger moved from the base's) counts against it. Its standard error comes from the
  spread over prompts (the pairs share seeds, so the base's own seed noise cancels);
* LLMs: ``W_LOSS * (base loss - loss) / base loss + W_ANSWERS * (F1 - base F1)`` on held-out data.

Not used to decide: no-reference aesthetic scores (BRISQUE, LAION aesthetics). They rate over-smoothed
"plastic" images better (Fizgig #47), the opposite of what finding an over-fit checkpoint needs, and
"pretty" is not "like my subject" (tests/test_quality_traps.py shows the over-smoothed image
winning on BRISQUE).

**Copies are never picked**: a checkpoint whose images sit within a few bits of a training image's
perceptual hash (``memorised``) is out of the pick and never the plateau's best.

**The pick**: the best score over checkpoints x strengths; an earlier checkpoint whose best is
within one standard error of it wins (fewer steps, same quality). **The stop** (``train.stop_when``):
``plateau: K``: K checkpoints in a row that do not beat the best so far by more than its standard
error (or ``min_delta``); ``target``: the best score reached it. Noise is never taken below
:data:`NOISE_FLOOR` (:func:`band`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from lorapod.rundir.layout import checkpoint_name

W_ADHERENCE = 1.0
W_LEAKAGE = 0.5
W_LOSS = 0.5
W_ANSWERS = 0.5
#: The smallest difference between two scores that is ever more than noise, whatever the standard
#: error says: a curve that has converged (every answer right, se 0) still moves by 1e-5 as its loss
#: creeps down, which is no reason to train on or to prefer a later checkpoint.
NOISE_FLOOR = 0.002


def band(se: float, min_delta: float = 0.0) -> float:
    """How much better than a score another must be to count as better: its standard error, or
    ``min_delta``, or :data:`NOISE_FLOOR`, whichever is largest."""
    return max(se, min_delta, NOISE_FLOOR)


def mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def sem(xs: Sequence[float]) -> float:
    """Standard error of the mean (0 for fewer than two values)."""
    if len(xs) < 2:
        return 0.0
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1) / len(xs))


def image_score(fidelity: Sequence[float], adherence: Sequence[float],
                leakage: Sequence[float]) -> tuple[float | None, float]:
    """(score, standard error) from per-prompt differences to the base; None without fidelity."""
    if not fidelity:
        return None, 0.0
    score, var = mean(fidelity), sem(fidelity) ** 2
    if adherence and mean(adherence) < 0:
        score += W_ADHERENCE * mean(adherence)
        var += (W_ADHERENCE * sem(adherence)) ** 2
    if leakage:
        score -= W_LEAKAGE * mean(leakage)
        var += (W_LEAKAGE * sem(leakage)) ** 2
    return score, math.sqrt(var)


def llm_score(loss: float | None, base_loss: float | None, f1_deltas: Sequence[float]) -> tuple[float | None, float]:
    parts, var = [], 0.0
    if loss is not None and base_loss and base_loss > 0 and math.isfinite(loss):
        parts.append(W_LOSS * (base_loss - loss) / base_loss)
    if f1_deltas:
        parts.append(W_ANSWERS * mean(f1_deltas))
        var += (W_ANSWERS * sem(f1_deltas)) ** 2
    return (sum(parts) if parts else None), math.sqrt(var)


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(float(x)):
        return None
    return float(x)


@dataclass(frozen=True)
class Candidate:
    checkpoint: str
    step: int
    strength: float
    score: float
    se: float


def best_of(record: dict[str, Any]) -> Candidate | None:
    """A checkpoint's best strength that is scored and not a copy of a training image."""
    best: Candidate | None = None
    strengths = record.get("strengths")
    if not isinstance(strengths, dict):
        return None
    for key, entry in strengths.items():
        if not isinstance(entry, dict) or entry.get("memorised") is True:
            continue
        score, se, strength = _num(entry.get("score")), _num(entry.get("se")) or 0.0, _num(_float(key))
        if score is None or strength is None:
            continue
        cand = Candidate(str(record.get("checkpoint") or checkpoint_name(int(record["step"]))), int(record["step"]),
                         strength, score, se)
        if best is None or cand.score > best.score or (cand.score == best.score and strength > best.strength):
            best = cand
    return best


def _float(key: Any) -> float | None:
    try:
        return float(key)
    except (TypeError, ValueError):
        return None


def pick(records: Iterable[dict[str, Any]], off: str | None = None) -> dict[str, Any]:
    """The decision as ``pick.json`` holds it. ``off``: why the autopilot does not decide (no
    references, no scorer): said, and no checkpoint picked."""
    records = list(records)
    table = [{"checkpoint": r.get("checkpoint"), "step": r.get("step"),
              "best": (lambda c: {"strength": c.strength, "score": c.score, "se": c.se} if c else None)(best_of(r)),
              "memorised": sorted(k for k, e in (r.get("strengths") or {}).items()
                                  if isinstance(e, dict) and e.get("memorised") is True)}
             for r in records]
    if off:
        return {"autopilot": "off", "checkpoint": None, "strength": None, "score": None, "reason": off, "table": table}
    cands = [c for r in records if (c := best_of(r)) is not None]
    if not cands:
        why = ("no checkpoint scored yet" if not records else
               "every scored checkpoint copies a training image or has no score: none to pick")
        return {"autopilot": "on", "checkpoint": None, "strength": None, "score": None, "reason": why, "table": table}
    top = max(cands, key=lambda c: (c.score, c.strength))
    chosen = next(c for c in sorted(cands, key=lambda c: c.step) if c.score >= top.score - band(top.se))
    reason = (f"best score {top.score:+.4f} ± {top.se:.4f} at {top.checkpoint}, strength {top.strength:g}"
              if chosen is top else
              f"{chosen.checkpoint} (strength {chosen.strength:g}) scores {chosen.score:+.4f}, within the noise "
              f"(± {band(top.se):.4f}) of the best {top.score:+.4f} at {top.checkpoint}: fewer steps, same quality")
    copies = [f"{r.get('checkpoint')} at {', '.join(t['memorised'])}" for r, t in zip(records, table, strict=True)
              if t["memorised"]]
    if copies:
        reason += f"; left out as copies of training images: {'; '.join(copies)}"
    later = [c for c in cands if c.step > chosen.step]
    if later and max(c.score for c in later) < chosen.score - band(chosen.se):
        reason += "; the score fell after it (later checkpoints over-fit or drift)"
    elif not later and len(cands) > 1:
        reason += "; it is the last scored checkpoint: more training may still help"
    return {"autopilot": "on", "checkpoint": chosen.checkpoint, "step": chosen.step, "strength": chosen.strength,
            "score": chosen.score, "se": chosen.se, "reason": reason, "table": table}


def stop_reason(records: Sequence[dict[str, Any]], plateau: int | None, target: float | None,
                min_delta: float = 0.0, min_checkpoints: int = 2) -> str | None:
    """Why to stop now, or None. ``records`` oldest first (one per scored checkpoint)."""
    bests = [best_of(r) for r in records]
    if target is not None:
        hit = next((c for c in bests if c is not None and c.score >= target), None)
        if hit is not None:
            return f"target reached: score {hit.score:+.4f} >= {target:g} at {hit.checkpoint}, strength {hit.strength:g}"
    if plateau is None or len(records) < max(min_checkpoints, plateau + 1):
        return None
    record: Candidate | None = None
    record_at = -1
    for i, c in enumerate(bests):
        if c is None:
            continue
        if record is None or c.score > record.score + band(record.se, min_delta):
            record, record_at = c, i
    if record is None:
        return None
    since = len(bests) - 1 - record_at
    if since < plateau:
        return None
    tail = ", ".join(f"{r.get('checkpoint')} {c.score:+.4f}" if c else f"{r.get('checkpoint')} -"
                     for r, c in zip(records[record_at + 1:], bests[record_at + 1:], strict=True))
    return (f"plateau: the best score {record.score:+.4f} ± {record.se:.4f} at {record.checkpoint}; the {since} "
            f"checkpoint(s) since ({tail}) are not better by more than {band(record.se, min_delta):.4f}")
