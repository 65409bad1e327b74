"""``lorapod export RUN --to hub --repo user/name``: publish the adapter (or merged model, or GGUF).

The files are the same ones ``--to peft|comfyui|diffusers|merged|gguf`` writes, staged in a
temporary folder with the model card (:mod:`lorapod.export.card`) and the newest sample images,
then sent with huggingface_hub's own ``create_repo(exist_ok=True)`` and ``upload_folder`` (one
commit; huggingface_hub retries its own idempotent steps). The token is huggingface_hub's
(``HF_TOKEN`` or ``hf auth login``), never printed; ``HF_ENDPOINT`` is honoured.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from lorapod.errors import ExportError
from lorapod.export.card import CardFile, read_metrics_file, render
from lorapod.rundir.layout import sample_step

_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
SAMPLE_EXTS = (".png", ".jpg", ".jpeg", ".webp")
MAX_SAMPLES = 8
#: A sample image larger than this is not uploaded: lorapod's own are a few MB at 1024 px.
MAX_SAMPLE_BYTES = 20 * 1024 * 1024
#: Nor one wider or taller than this (read from the header; no pixel is decoded).
MAX_SAMPLE_SIDE = 8192
#: The images among the samples lorapod's engines name (rundir/layout.py ``sample_step``:
#: ``step000200-00.png``); the step picks the newest, never the order of names a host chose.
SAMPLE_IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".webp")
_PIL_FORMAT = {"png": "PNG", "jpg": "JPEG", "jpeg": "JPEG", "webp": "WEBP"}


@dataclass
class Published:
    url: str
    commit: str
    files: list[str]
    notes: list[str] = field(default_factory=list)


def loads_with(path: str, spec, repo_id: str) -> str:
    """Which tool loads a published file, and how."""
    name = Path(path).name
    base = spec.model.id
    if name == "README.md":
        return "this card"
    if path.startswith("samples/"):
        return "a sample image (seed and prompt in its PNG metadata)"
    if name == "adapter_config.json" or name == "adapter_model.safetensors":
        return f"PEFT: `PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(\"{base}\"), \"{repo_id}\")`"
    if name == "pytorch_lora_weights.safetensors":
        return f"diffusers: `pipe.load_lora_weights(\"{repo_id}\")` on a `{base}` pipeline"
    if name.endswith(".gguf"):
        return "llama.cpp: `llama-cli -m BASE.gguf --lora " + name + "` (Ollama: ADAPTER in a Modelfile)"
    if name.endswith(".safetensors") and spec.is_image and "/" not in path:
        return "ComfyUI (`models/loras`, LoraLoader), Forge and A1111 (`models/Lora`)"
    if name in ("config.json", "model_index.json") or name.endswith((".safetensors", ".json", ".txt", ".model", ".jinja")):
        return f"transformers/diffusers `from_pretrained(\"{repo_id}\")` (merged model)"
    return "-"


def publish(run: str | Path, repo_id: str, *, private: bool = False, merged: bool = False, gguf: bool = False,
            checkpoint: int | None = None, base: str | None = None, say=print, final: bool = False) -> Published:
    from lorapod.export.source import open_source, quality_pick
    from lorapod.export.targets import export_run
    from lorapod.rundir import RunDir

    if not _REPO_ID.match(repo_id):
        raise ExportError(f"--repo {repo_id!r} is not a Hub repo id", hint="user/name or org/name, e.g. --repo me/mug-lora")
    if merged and gguf:
        raise ExportError("--merged and --gguf are two different uploads", hint="pick one (or neither: the adapter)")
    try:
        import huggingface_hub
        from huggingface_hub import HfApi
        from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled
    except ImportError as exc:
        from lorapod.errors import DependencyError

        raise DependencyError("publishing needs huggingface_hub", hint="pip install 'lorapod[export]'") from exc
    picked = quality_pick(RunDir.open(run)) if checkpoint is None and not final and not Path(run).is_file() else None
    if picked is not None:  # the autopilot's pick by default, as `export --to X` takes it
        checkpoint = picked.step
    src = open_source(run, checkpoint)
    spec = src.spec
    if gguf and src.is_image:
        raise ExportError("--gguf is for LLM adapters (llama.cpp)", hint="drop --gguf; image runs upload the LoRA files")
    api = HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None)  # read now, not at huggingface_hub's import
    if api.token is None and huggingface_hub.get_token() is None:
        raise ExportError("no Hugging Face token here", hint="export HF_TOKEN=hf_... (a write token from "
                          "huggingface.co/settings/tokens), or run `hf auth login`")
    what = "merged" if merged else "gguf" if gguf else "adapter"
    targets = ["merged"] if merged else ["gguf"] if gguf else (["comfyui", "diffusers"] if src.is_image else ["peft"])
    notes: list[str] = [picked.note(src.is_image)] if picked is not None else []
    with tempfile.TemporaryDirectory(prefix="lorapod-hub-") as work:
        stage = Path(work) / "repo"
        stage.mkdir()
        for target in targets:
            done = export_run(run, target, checkpoint, Path(work) / target, base, final=final, record=False)
            for f in done.files:
                dest = stage / f
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(done.out / f, dest)
            notes += [n for n in done.notes if n not in notes]
        for s in _samples(src.run.samples):
            (stage / "samples").mkdir(exist_ok=True)
            shutil.copy2(s, stage / "samples" / s.name)
        rel = sorted(str(p.relative_to(stage)) for p in stage.rglob("*") if p.is_file())
        files = [CardFile("README.md", "this card")] + [CardFile(r, loads_with(r, spec, repo_id)) for r in rel]
        from importlib.metadata import version

        from lorapod.rundir import quality as qfiles

        card = render(spec, repo_id=repo_id, what=what, files=files, metrics=read_metrics_file(src.run.metrics_file),
                      samples=[r for r in rel if r.startswith("samples/")], lorapod_version=version("lorapod"),
                      quality=qfiles.read_json(src.run.root, qfiles.PICK), label=src.label)
        (stage / "README.md").write_text(card, encoding="utf-8")
        try:
            url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
            say(f"uploading {len(rel) + 1} file(s) to {url}")
            info = api.upload_folder(repo_id=repo_id, folder_path=str(stage), repo_type="model",
                                     commit_message=f"lorapod: {what} of {src.run.job_id} ({src.label})")
        except HfHubHTTPError as exc:
            status = exc.response.status_code if exc.response is not None else "?"
            hint = {401: "the token is missing or invalid: export HF_TOKEN=hf_... (a write token)",
                    403: f"the token cannot write to {repo_id.split('/')[0]}: use a write token of that user/org"}.get(
                status, "try again; the Hub said what went wrong above")
            raise ExportError(f"the Hub refused the upload to {repo_id} (HTTP {status}): {str(exc)[:300]}",
                              hint=hint) from exc
        except OfflineModeIsEnabled as exc:
            raise ExportError("huggingface_hub is in offline mode (HF_HUB_OFFLINE is set)",
                              hint="unset HF_HUB_OFFLINE for the upload") from exc
        except ValueError as exc:  # huggingface_hub's own checks, e.g. the card's metadata (validate-yaml)
            raise ExportError(f"the upload to {repo_id} failed: {str(exc)[:300]}", hint="see the message above") from exc
        except _transport_errors() as exc:  # no answer at all: DNS, refused, reset, timed out
            where = api.endpoint
            raise ExportError(f"could not reach the Hugging Face Hub at {where}: {type(exc).__name__}: "
                              f"{str(exc)[:200] or 'no answer'}; nothing was uploaded",
                              hint="check the network" + (" and HF_ENDPOINT" if os.environ.get("HF_ENDPOINT") else "")
                              + ", then run the same export again (the files are rebuilt from the run)") from exc
    src.run.event(f"published {what} of {src.label} to {repo_id} ({info.oid})")
    from lorapod.store.published import remember

    # on this machine, not in the run folder (a host writes that): `lorapod deploy` serves it
    remember(src.run.root, {"repo": repo_id, "what": what, "label": src.label, "commit": info.oid,
                            "private": private, "job_id": src.run.job_id})
    return Published(str(url), info.oid, ["README.md", *rel], notes)


def _transport_errors() -> tuple[type[BaseException], ...]:
    """The errors of a request that got no HTTP answer, from the client huggingface_hub uses
    (httpx2 in huggingface_hub 2.x, httpx in 1.x, requests before: its ConnectionError and Timeout
    are OSErrors). Read from the modules huggingface_hub has imported, so no client is imported here."""
    import sys

    out: list[type[BaseException]] = [OSError]
    for module, name in (("httpx2", "TransportError"), ("httpx", "TransportError"), ("requests", "RequestException")):
        cls = getattr(sys.modules.get(module), name, None)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            out.append(cls)
    return tuple(out)


def _samples(folder: Path) -> list[Path]:
    """The newest step's sample images, at most MAX_SAMPLES: only files named as lorapod names
    samples, regular files (no links) under :data:`MAX_SAMPLE_BYTES`, that open as the image their
    suffix says and are at most :data:`MAX_SAMPLE_SIDE` px a side. A remote run's ``samples/`` is
    what the host wrote: before, a 2 GB file of zeros was uploaded as a sample, and a file name
    that sorted last chose which samples went."""
    import stat

    if not folder.is_dir() or folder.is_symlink():
        return []
    by_step: dict[int, list[tuple[int, Path]]] = {}
    for p in folder.iterdir():
        got = sample_step(p.name) if p.name.endswith(SAMPLE_IMAGE_EXTS) else None
        if got is None:
            continue
        try:
            st = p.lstat()
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and 0 < st.st_size <= MAX_SAMPLE_BYTES:
            by_step.setdefault(got[0], []).append((got[1], p))
    for step in sorted(by_step, reverse=True):  # the newest step with a real image
        good = [p for _, p in sorted(by_step[step]) if _is_image(p)][:MAX_SAMPLES]
        if good:
            return good
    return []


def _is_image(path: Path) -> bool:
    """Whether ``path`` is an image of the format its suffix names, of a sane size (header only)."""
    from PIL import Image, UnidentifiedImageError

    fmt = _PIL_FORMAT[path.suffix.lower().lstrip(".")]
    try:
        with Image.open(path, formats=[fmt]) as im:
            w, h = im.size
            im.verify()  # the file's structure (chunks, CRCs), without decoding pixels
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        return False
    return 0 < w <= MAX_SAMPLE_SIDE and 0 < h <= MAX_SAMPLE_SIDE
