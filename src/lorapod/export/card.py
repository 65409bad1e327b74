"""The model card (the repo's README.md) lorapod writes when it publishes a run to the Hugging Face Hub.

What a person deciding whether to use the adapter needs, from the run folder itself: the base model
and its licence (a non-commercial base's licence is carried over, and a gated base is named as
such), the trigger word, the training settings, the evaluation results, sample images, and every
file with the tool that loads it. The YAML metadata is written by huggingface_hub's own
``ModelCardData`` (the Hub validates it on upload: ``/api/validate-yaml``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# catalog licence names -> the Hub's licence identifiers (huggingface.co/docs/hub/repositories-licenses);
# a licence the Hub has no identifier for is ``other`` with its name and link
HUB_LICENSES = {
    "apache-2.0": ("apache-2.0", None), "mit": ("mit", None),
    "creativeml openrail-m": ("creativeml-openrail-m", None), "creativeml open rail++-m": ("openrail++", None),
    "llama 3.2 community license": ("llama3.2", None), "llama 3.1 community license": ("llama3.1", None),
    "llama 3 community license": ("llama3", None), "gemma terms of use": ("gemma", None),
    "flux.1 [dev] non-commercial license": (
        "other", ("flux-1-dev-non-commercial-license",
                  "https://huggingface.co/black-forest-labs/FLUX.1-dev/blob/main/LICENSE.md")),
    "flux non-commercial license": (
        "other", ("flux-non-commercial-license",
                  "https://huggingface.co/black-forest-labs/FLUX.2-klein-9B/blob/main/LICENSE.md")),
}


@dataclass(frozen=True)
class BaseInfo:
    """What the catalog says about the base model (None fields: the catalog does not know it)."""

    hub_id: str | None
    license: str | None
    gated: bool | None
    commercial: bool


def base_info(spec) -> BaseInfo:
    from lorapod.catalog.models import find_model
    from lorapod.errors import LorapodError

    mid = str(spec.model.id)
    hub_id = mid if "/" in mid and not Path(mid).exists() and not mid.startswith("lorapod:") else None
    try:
        model = find_model(mid, spec.model.family, spec.model.variant)
    except (LorapodError, OSError, ValueError):
        return BaseInfo(hub_id, None, None, True)
    lic = getattr(model, "license", None)
    return BaseInfo(hub_id, getattr(lic, "name", None), getattr(lic, "gated", None), getattr(lic, "commercial", True))


@dataclass(frozen=True)
class CardFile:
    path: str  # in the repo
    loads_with: str


def eval_results(metrics: list[dict]) -> list[tuple[str, float, float, int]]:
    """(metric, base, tuned, step) from the run's first and last evaluation."""
    evals = [r for r in metrics if r.get("event") == "eval"]
    out = []
    for key in ("val_loss", "val_ppl", "fixed_noise_loss"):
        seen = [r for r in evals if isinstance(r.get(key), int | float)]
        if len(seen) >= 2:
            out.append((key, float(seen[0][key]), float(seen[-1][key]), int(seen[-1].get("step", 0))))
    return out


def quality_lines(decision: dict | None, label: str | None, is_image: bool) -> list[str]:
    """The card's "Checkpoint and strength" section from the quality autopilot's decision
    (quality/pick.json): which checkpoint this is, at what strength, the scores that decided it."""
    from lorapod.rundir.metrics import number

    if not decision:
        return []
    lines = ["## Checkpoint and strength", ""]
    pick, strength = decision.get("checkpoint"), number(decision.get("strength"))
    if isinstance(pick, str):
        at = f" at strength **{strength:g}**" if is_image and strength is not None else ""
        this = "This is that checkpoint." if pick == label else f"This upload is {label}, not the pick."
        lines.append(f"lorapod's quality autopilot picked **{pick}**{at}: {str(decision.get('reason'))[:600]}. {this}")
    else:
        lines.append(f"No checkpoint was picked by lorapod's quality autopilot: {str(decision.get('reason'))[:600]}.")
    table = [t for t in decision.get("table") or [] if isinstance(t, dict)]
    if table:
        lines += ["", "| checkpoint | score vs the base | ± | strength |", "|---|---|---|---|"]
        for t in table[:50]:
            b = t.get("best") if isinstance(t.get("best"), dict) else {}
            sc, se, st = number(b.get("score")), number(b.get("se")), number(b.get("strength"))
            lines.append(f"| {str(t.get('checkpoint'))[:40]} | {f'{sc:+.4f}' if sc is not None else '-'} | "
                         f"{f'{se:.4f}' if se is not None else '-'} | {f'{st:g}' if st is not None else '-'} |")
        lines += ["", "Scores are differences from the base model at the same seeds and prompts: "
                  + ("likeness to held-out reference images (DINOv2, CLIP), prompt adherence and leakage; a "
                     "checkpoint that copies a training image is never picked." if is_image else
                     "held-out loss and answers to held-out conversations (token F1).")]
    lines.append("")
    return lines


def render(spec, *, repo_id: str, what: str, files: list[CardFile], metrics: list[dict],
           samples: list[str], lorapod_version: str, quality: dict | None = None, label: str | None = None) -> str:
    """The README.md text: YAML metadata (huggingface_hub's ModelCardData) and the card. ``quality``:
    the quality autopilot's decision (quality/pick.json); ``label``: which checkpoint is uploaded."""
    from huggingface_hub import ModelCardData

    info = base_info(spec)
    # an unknown licence is left out of the metadata rather than guessed; the card body says so
    licence_id, other = HUB_LICENSES.get((info.license or "").lower(), ("other", (info.license, None))) \
        if info.license else (None, None)
    tags = ["lora", "lorapod"] + (["text-to-image", "diffusers"] if spec.is_image else ["peft"])
    if spec.is_video:
        tags.append("text-to-video")
    data = ModelCardData(
        license=licence_id, license_name=other[0] if other else None, license_link=other[1] if other else None,
        base_model=info.hub_id, tags=tags, library_name="diffusers" if spec.is_image else "peft",
        pipeline_tag=("text-to-video" if spec.is_video else "text-to-image") if spec.is_image else "text-generation",
        instance_prompt=spec.data.trigger or None,
    )
    name = repo_id.split("/")[-1]
    m, t, d = spec.method, spec.train, spec.data
    lines = [f"# {name}", "",
             f"A {'LoRA adapter' if what == 'adapter' else 'merged model' if what == 'merged' else 'GGUF LoRA adapter'} "
             f"for **{spec.model.id}**, trained with lorapod {lorapod_version}.", ""]
    lines += ["## Base model and licence", ""]
    if info.license:
        lines.append(f"- Base: `{spec.model.id}`, licence: **{info.license}**.")
        if not info.commercial:
            lines.append(f"- **Non-commercial.** This {what} is derived from a base under the {info.license}; that "
                         f"licence's terms apply to it and to what it generates (no commercial use unless the "
                         f"licence holder grants it).")
        if info.gated:
            lines.append(f"- The base is **gated** on the Hub: accept its terms at https://huggingface.co/{info.hub_id or spec.model.id} "
                         f"and use a token to download it.")
    else:
        lines.append(f"- Base: `{spec.model.id}`; its licence is not in lorapod's catalog: read the base's own model card, "
                     f"its terms apply to this {what} too.")
    lines.append("")
    if d.trigger:
        lines += ["## Trigger word", "", f"Start prompts with **`{d.trigger}`**; without it the concept should not appear.", ""]
    lines += ["## Training settings", "", "| setting | value |", "|---|---|",
              f"| method | {m.type}, rank {m.r}, alpha {m.alpha:g}{', rsLoRA' if m.rslora else ''}, dropout {m.dropout:g} |",
              f"| targets | {m.target_modules if isinstance(m.target_modules, str) else ', '.join(m.target_modules)} |",
              f"| learning rate | {t.learning_rate:g} ({t.scheduler}, {t.warmup_steps} warmup steps) |",
              f"| optimizer | {t.optimizer} |",
              f"| batch | {t.micro_batch_size} x {t.grad_accum} accumulation |",
              f"| length | {f'{t.max_steps} steps' if t.max_steps else f'{t.epochs} epochs'} |",
              f"| precision | {t.precision} |", f"| seed | {t.seed} |"]
    if spec.is_image:
        lines.append(f"| resolution | {d.resolution}{' (aspect buckets)' if d.buckets else ''}, repeats {d.repeats} |")
    else:
        lines.append(f"| sequence length | {d.sequence_len}{' (packed)' if d.packing else ''} |")
    steps = [r["step"] for r in metrics if "loss" in r and isinstance(r.get("step"), int)]
    if steps:
        lines.append(f"| steps trained | {max(steps)} |")
    lines.append("")
    results = eval_results(metrics)
    lines += ["## Evaluation", ""]
    if results:
        lines += ["| metric | base | tuned | at step |", "|---|---|---|---|"]
        lines += [f"| {k} | {b:.4f} | {a:.4f} | {s} |" for k, b, a, s in results]
        lines += ["", "Base is the model before training (step 0); lower is better. "
                  + ("Validation on held-out conversations." if not spec.is_image else
                     "Fixed-noise loss: the denoising loss on fixed noise and timesteps over the training images.")]
    else:
        lines.append("No evaluation was recorded for this run.")
    lines.append("")
    lines += quality_lines(quality, label, spec.is_image)
    if samples:
        lines += ["## Samples", ""] + [f"![{Path(s).stem}]({s})" for s in samples] + [""]
    lines += ["## Files", "", "| file | loads with |", "|---|---|"]
    lines += [f"| `{f.path}` | {f.loads_with} |" for f in files]
    lines.append("")
    return f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines)


def read_metrics_file(path: Path) -> list[dict]:
    from lorapod.rundir.metrics import read_records

    return read_records(Path(path))

