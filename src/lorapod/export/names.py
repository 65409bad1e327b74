"""Which ``--to`` targets apply to a run, decided from its spec.yaml alone (no torch, no diffusers),
so ``lorapod export RUN --to X`` refuses a target that does not apply at once instead of after the
seconds it takes to import the libraries that write the others."""

from __future__ import annotations

from pathlib import Path

from lorapod.errors import ExportError

LLM_TARGETS = ("peft", "merged", "gguf", "ollama")
IMAGE_TARGETS = ("comfyui", "diffusers", "merged")
FILE_TARGETS = ("comfyui", "diffusers")  # a LoRA .safetensors converted between kohya and diffusers
HUB = "hub (upload to the Hugging Face Hub, with --repo user/name)"


def choices(is_image: bool) -> str:
    """Every --to a run of this kind takes, hub included: what a refusal lists."""
    return ", ".join(IMAGE_TARGETS if is_image else LLM_TARGETS) + f", or {HUB}"


def check_target(run: str | Path, to: str) -> None:
    """An ExportError when ``to`` cannot apply to ``run`` (a run folder or a LoRA file); silent when
    it may (the export itself reports a run folder it cannot read)."""
    path = Path(run)
    if path.is_file():
        if to not in FILE_TARGETS:
            raise ExportError(f"--to {to} does not apply to a LoRA file (it converts between formats)",
                              hint=f"choose one of: {', '.join(FILE_TARGETS)}")
        return
    if to not in {*LLM_TARGETS, *IMAGE_TARGETS}:
        raise ExportError(f"--to {to} is not an export target",
                          hint=f"LLM runs: {', '.join(LLM_TARGETS)}; image runs: {', '.join(IMAGE_TARGETS)}; "
                               "either: hub (with --repo)")
    spec_file = path / "spec.yaml"
    if not spec_file.is_file():
        return
    from lorapod.errors import SpecError
    from lorapod.spec import load_spec

    try:
        is_image = load_spec(spec_file).is_image
    except SpecError:
        return  # the export names what is wrong with the spec
    allowed = IMAGE_TARGETS if is_image else LLM_TARGETS
    if to not in allowed:
        kind = "an image" if is_image else "an LLM"
        raise ExportError(f"--to {to} is not available for {kind} run", hint=f"choose one of: {choices(is_image)}")
