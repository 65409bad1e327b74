"""The scoring prompts: the trigger in scenes the data does not show, and prompts without it.

The guides' three tests of a LoRA, each a kind of prompt here:

- **fidelity** and **flexibility** ("the subject in a new scene"): prompts with the trigger in new
  scenes, scored for likeness to the held-out references and for adherence to the scene;
- **leakage** ("without the trigger the model should draw what the base draws"): prompts without the
  trigger, scored by how far the checkpoint's image moved from the base's at the same seed.

The default prompts use the data's own words: the trigger in :data:`SCENES`, and leakage prompts
from the run's captions with the trigger taken out ("zxq mug on a table" -> "mug on a table", the
class the LoRA must not take over). CLIP does not know a made-up trigger word, so adherence is
scored against the prompt with the trigger removed (:attr:`ScorePrompt.scene`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: New scenes for the trigger: none of them is a studio shot of the subject.
SCENES = ("{t} on a sandy beach at sunset", "{t} in a snowy forest", "{t} on a wooden table in a cozy kitchen",
          "a watercolor painting of {t}")
#: Leakage prompts when the captions give none: everyday scenes the subject should not enter.
GENERIC = ("a photo of a city street", "a bowl of fruit on a table")
MAX_LEAKAGE = 2


@dataclass(frozen=True)
class ScorePrompt:
    prompt: str  # as drawn (sd-scripts options removed)
    seed: int
    leakage: bool  # no trigger: scored for drift from the base, not for fidelity
    scene: str  # the prompt without the trigger: what CLIP's text side is asked about
    width: int | None = None
    height: int | None = None
    steps: int | None = None
    scale: float | None = None
    negative: str = ""


def strip_trigger(text: str, trigger: str | None) -> str:
    """``text`` without the trigger word and the punctuation it leaves behind."""
    if not trigger:
        return text.strip()
    out = re.sub(rf"(?i)\b{re.escape(trigger.strip())}\b", " ", text)
    out = re.sub(r"\s*,\s*,+", ",", out)
    out = re.sub(r"\s+", " ", out).strip(" ,;:.")
    return out


def default_prompts(trigger: str | None, captions: list[str]) -> list[str]:
    """The trigger in :data:`SCENES`, then up to two captions without it (or :data:`GENERIC`)."""
    t = (trigger or "").strip()
    out = [s.format(t=t) for s in SCENES] if t else []
    leak: list[str] = []
    for cap in captions:
        if t and t.lower() not in cap.lower():
            continue  # a regularisation caption: not about the subject
        c = strip_trigger(cap.split("\n")[0], t)[:200]
        if len(c) >= 3 and c not in leak:
            leak.append(c)
        if len(leak) >= MAX_LEAKAGE:
            break
    out += leak or list(GENERIC[:MAX_LEAKAGE])
    return out


def score_prompts(lines: list[str] | None, trigger: str | None, captions: list[str], seed: int,
                  width: int, height: int, steps: int, scale: float,
                  parse_line: Callable[..., Any]) -> list[ScorePrompt]:
    """The prompts to score with, each with its own seed (``seed + index``); ``lines`` (quality.prompts)
    may carry sd-scripts options (``--w --h --d --s --l --n``), read by ``parse_line`` (the engine's
    sample-prompt reader, engine/diffusion/samples.py, handed in: the engine sits above this package)."""
    texts = lines if lines else default_prompts(trigger, captions)
    t = (trigger or "").strip().lower()
    out = []
    for i, line in enumerate(texts):
        sp = parse_line(line, width, height, seed + i, steps, scale)
        leakage = bool(t) and t not in sp.prompt.lower()
        out.append(ScorePrompt(sp.prompt, sp.seed, leakage, strip_trigger(sp.prompt, trigger) or sp.prompt,
                               sp.width, sp.height, sp.steps, sp.scale, sp.negative))
    return out
