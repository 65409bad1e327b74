"""An LLM checkpoint's numbers: held-out loss, and its answers against the held-out references.

The answers are greedy (deterministic) replies to the first user turn of held-out conversations
(``data.val_split`` / ``data.val_path``: never trained on), compared with the reference reply the
data holds: exact match and token F1 after SQuAD's normalisation (lower case, no punctuation, no
articles, single spaces; the measure of the SQuAD v1.1 evaluation script). The base answers once,
with the adapter disabled, at the same settings.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence
from typing import Any

from lorapod.quality import decide

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalise(text: str) -> str:
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(answer: str, reference: str) -> float:
    return float(normalise(answer) == normalise(reference))


def token_f1(answer: str, reference: str) -> float:
    a, r = normalise(answer).split(), normalise(reference).split()
    if not a or not r:
        return float(a == r)
    common = sum((Counter(a) & Counter(r)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(a), common / len(r)
    return 2 * precision * recall / (precision + recall)


def answers_row(answers: Sequence[str], references: Sequence[str]) -> dict[str, Any]:
    f1 = [token_f1(a, r) for a, r in zip(answers, references, strict=True)]
    em = [exact_match(a, r) for a, r in zip(answers, references, strict=True)]
    return {"f1": f1, "exact": em}


def llm_entry(val_loss: float | None, base: dict[str, Any], answers: Sequence[str],
              references: Sequence[str]) -> dict[str, Any]:
    row = answers_row(answers, references)
    base_f1 = base.get("f1") or []
    deltas = [a - b for a, b in zip(row["f1"], base_f1, strict=False)] if len(base_f1) == len(row["f1"]) else []
    base_loss = base.get("val_loss")
    score, se = decide.llm_score(val_loss, base_loss, deltas)
    return {
        "score": score, "se": se, "val_loss": val_loss, "val_loss_base": base_loss,
        "loss_gain": (base_loss - val_loss) / base_loss if val_loss is not None and base_loss else None,
        "f1": decide.mean(row["f1"]) if row["f1"] else None, "f1_base": decide.mean(base_f1) if base_f1 else None,
        "exact": decide.mean(row["exact"]) if row["exact"] else None,
        "exact_base": decide.mean(base.get("exact") or []) if base.get("exact") else None,
        "f1_delta": decide.mean(deltas) if deltas else None, "examples": len(answers),
    }
