"""One image checkpoint's numbers: its images against the base's at the same seeds and prompts.

A *render* is what one prompt drew at one strength: a list of frames (one for an image model; a
few, first / middle / last, for a video model, whose embeddings are averaged). The base row
(strength 0, drawn once per run and kept in ``quality/base.json``) holds, per prompt, the numbers
every checkpoint is compared with: its likeness to the references per scorer, its text-image
similarity to the prompt's scene, and, for leakage prompts, its embedding.

Per strength the entry holds the mean difference to the base for each part, the composite score
and its standard error (decide.py), the closest perceptual-hash distance of any image to a
training image, and whether an image is a copy of one (``memorised``: within
:data:`~lorapod.quality.scorers.COPY_BITS` of a training image where the base's image at that seed
was not, so a flat-colour prompt near a flat-colour regularisation image is not a copy).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lorapod.quality import decide
from lorapod.quality.prompts import ScorePrompt
from lorapod.quality.scorers import COPY_BITS, Scorers

Render = Sequence[Any]  # the frames one prompt drew (PIL images)


@dataclass
class References:
    """What the checkpoints are compared against, embedded once: the held-out images, and the
    training images' perceptual hashes."""

    clip: Any = None  # [n_refs, d] or None
    dino: Any = None
    faces: list[Any] | None = None
    train_hashes: list[Any] | None = None
    count: int = 0


def embed_references(scorers: Scorers, refs: Sequence[Any], training: Sequence[Any]) -> References:
    out = References(count=len(refs))
    if refs:
        if scorers.clip is not None:
            out.clip = scorers.clip.images(refs)
        if scorers.dino is not None:
            out.dino = scorers.dino.images(refs)
        if scorers.face is not None:
            out.faces = [d for d in (scorers.face.descriptor(im) for im in refs) if d is not None]
    if scorers.hashes:
        from lorapod.quality.scorers import phash

        out.train_hashes = [phash(im) for im in training]
    return out


def _mean_embedding(emb: Any, frames: Render) -> Any:
    import torch

    e = emb.images(list(frames))
    return torch.nn.functional.normalize(e.mean(dim=0, keepdim=True), dim=-1)


def _frames(render: Render) -> list[Any]:
    """First, middle and last frame of a clip; the image itself for an image model."""
    n = len(render)
    return [render[i] for i in sorted({0, n // 2, n - 1})] if n > 3 else list(render)


def prompt_numbers(scorers: Scorers, refs: References, sp: ScorePrompt, render: Render) -> dict[str, Any]:
    """One render's numbers: likeness to the references per scorer, adherence, its leakage
    embedding, the closest training image's hash distance."""
    frames = _frames(render)
    out: dict[str, Any] = {}
    if not sp.leakage:
        if refs.dino is not None and scorers.dino is not None:
            out["dino"] = float((_mean_embedding(scorers.dino, frames) @ refs.dino.T).mean())
        if refs.clip is not None and scorers.clip is not None:
            e = _mean_embedding(scorers.clip, frames)
            out["clip_i"] = float((e @ refs.clip.T).mean())
        if scorers.face is not None and refs.faces:
            d = scorers.face.descriptor(frames[len(frames) // 2])
            if d is not None:
                out["face"] = sum(scorers.face.similarity(d, r) for r in refs.faces) / len(refs.faces)
        if scorers.clip is not None:
            e = _mean_embedding(scorers.clip, frames)
            out["clip_t"] = float(e @ scorers.clip.texts([sp.scene]).T)
    else:
        emb = scorers.leak_embedder()
        if emb is not None:
            out["leak_emb"] = _mean_embedding(emb, frames)[0].tolist()
    if refs.train_hashes:
        from lorapod.quality.scorers import phash

        out["phash_min"] = min(int(phash(f) - h) for f in frames for h in refs.train_hashes)
    return out


IDENTITY = ("dino", "clip_i", "face")


def strength_entry(prompts: Sequence[ScorePrompt], base: Sequence[dict[str, Any]],
                   numbers: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The entry of one strength from its per-prompt numbers and the base's (same order as ``prompts``)."""
    import math

    fid: list[float] = []
    by: dict[str, list[float]] = {k: [] for k in IDENTITY}
    adh: list[float] = []
    leak: list[float] = []
    phash_min: int | None = None
    copies = 0
    for sp, b, n in zip(prompts, base, numbers, strict=True):
        if "phash_min" in n:
            phash_min = n["phash_min"] if phash_min is None else min(phash_min, n["phash_min"])
            # a copy the training made: the base, at the same seed, drew nothing that close
            copies += n["phash_min"] <= COPY_BITS and b.get("phash_min", COPY_BITS + 1) > COPY_BITS
        if sp.leakage:
            if "leak_emb" in n and "leak_emb" in b:
                dot = sum(x * y for x, y in zip(n["leak_emb"], b["leak_emb"], strict=True))
                leak.append(max(0.0, 1.0 - dot))
            continue
        deltas = [n[k] - b[k] for k in IDENTITY if k in n and k in b]
        for k in IDENTITY:
            if k in n and k in b:
                by[k].append(n[k] - b[k])
        if deltas:
            fid.append(sum(deltas) / len(deltas))
        if "clip_t" in n and "clip_t" in b:
            adh.append(n["clip_t"] - b["clip_t"])
    score, se = decide.image_score(fid, adh, leak)
    entry: dict[str, Any] = {
        "score": score, "se": se,
        "fidelity": decide.mean(fid) if fid else None,
        "fidelity_by": {k: decide.mean(v) for k, v in by.items() if v},
        "adherence": decide.mean(adh) if adh else None,
        "leakage": decide.mean(leak) if leak else None,
        "phash_min": phash_min,
        "memorised": copies > 0,
        "copies": copies,
        "prompts": {"fidelity": len(fid), "leakage": len(leak)},
    }
    if entry["score"] is not None and not math.isfinite(entry["score"]):
        entry["score"] = None
    return entry
