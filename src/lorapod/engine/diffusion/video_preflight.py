"""Before renting a GPU for a video job: the clips must give training windows, and the job must fit.

``lorapod run`` calls :func:`preflight` on this machine before any instance exists. It runs the same
scan training runs (so an undecodable, too-short or uncaptioned folder stops here, not after the
model download), then reads the Wan transformer's and VAE's config.json (a few hundred bytes) and
compares the planner's peak for it (``memory.check_fits``, plan/vram.py) with the GPU named by ``--gpu`` / ``compute.gpu``.
"""

from __future__ import annotations

from lorapod.data.findings import Finding
from lorapod.errors import DependencyError, ModelLoadError


def preflight(spec, gpu: str | None = None, say=print) -> list[Finding]:
    """Findings of the data scan (DataError when nothing trains); HardwareError when the job cannot
    fit ``gpu`` with its ``train.blocks_to_swap`` (the hint gives the count that would)."""
    try:
        from lorapod.engine.diffusion import memory
        from lorapod.engine.diffusion import video_data as vd
    except ImportError as exc:
        raise DependencyError(f"checking a video job before renting needs the video engine here ({exc})",
                              hint="pip install 'lorapod[video]'") from exc

    d, t = spec.data, spec.train
    rule = vd.FrameRule(tuple(d.target_frames), d.frame_extraction, d.frame_sample, d.frame_stride, d.fps)
    items, findings = vd.scan(spec.data_paths(), d.resolution, d.caption_extension, d.repeats, rule, d.trigger)
    for f in findings:
        say(f"[{f.severity}] {f.path}: {f.message}")
    info = vd.describe(items)
    say(f"video data: {info['files']} files -> {info['windows']} windows, buckets {info['buckets']}")
    if not gpu:
        return findings
    from lorapod.catalog.gpus import find_gpu

    card = find_gpu(gpu)
    try:
        model = memory.memory_model(spec)
    except ModelLoadError as exc:
        say(f"fit check skipped (the model's config is not readable here: {exc.message})")
        return findings
    tokens = max(model.window_tokens(f, w, h) for f, w, h in (it.bucket for it in items))
    memory.check_fits(spec, model, card.vram_gb, dtype="fp8" if spec.model.dtype == "fp8" else "bf16", tokens=tokens,
                   what=f"{spec.model.id} on {card.name} at {tokens} latent tokens")
    say(f"fits {card.name} ({card.vram_gb:g} GB) with train.blocks_to_swap: {t.blocks_to_swap}")
    return findings
