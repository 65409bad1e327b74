"""Base models: image families (U-Nets and diffusion transformers) and LLM architectures.

An LLM's size is computed from its transformers ``config.json`` (a local model folder, a
cached hub id, or a built-in entry), so any decoder model can be planned, not only the ones
listed. Image families come from the catalog: their memory behaviour is not in any config.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

from lorapod.catalog import families
from lorapod.catalog.snapshot import Snapshot, closest_canonical, load_data, normalise
from lorapod.errors import PlanError

# Models lorapod builds itself (the demo's random tiny Llama): no hub id, no catalog entry, no GPU.
BUILTIN_PREFIX = "lorapod:"


def is_builtin(model_id: str) -> bool:
    """Whether ``model_id`` names one of lorapod's built-in models (``lorapod:tiny-llama``)."""
    return model_id.startswith(BUILTIN_PREFIX)


@dataclass(frozen=True)
class License:
    name: str
    gated: bool | None
    commercial: bool


@dataclass(frozen=True)
class ImageModel:
    """A diffusion model family member, with what the VRAM and speed models need."""

    key: str
    name: str
    family: str
    variant: str | None
    kind: str  # unet | dit
    trained_params_b: float
    text_encoder_params_b: float
    vae_params_b: float
    download_gb: float
    lora_params_per_rank_m: float
    ref_resolution: int
    activations_gc_gb: float
    activations_full_gb: float
    vae_encode_gb: float
    default_dtype: str
    license: License
    fwd_tflops_at_ref: float | None = None
    attn_tflops_at_ref: float = 0.0
    vae_encode_tflops_at_ref: float = 0.0
    kernels_per_fwd: int = 1000
    # Memory-bound operators' traffic, counted (plan/counted_models.py: memory_bound_traffic): U-Nets
    # in GB at the reference size (batch 1), DiTs in MB per token; (forward, backward).
    traffic_gb_at_ref: tuple[float, float] = (0.0, 0.0)
    traffic_mb_per_token: tuple[float, float] = (0.0, 0.0)
    patch_px: int | None = None
    # DiTs: parameters each token's matmuls pass through, counted (plan/counted_models.py); below the
    # parameter count where weights serve only some tokens or run once a sample.
    token_params_b: float | None = None
    text_tokens: int = 0
    blocks: int | None = None
    hidden: int = 0
    attn_blocks: int = 0
    joint_text: bool = True
    frames_per_latent: int = 0  # video VAEs: frames folded into one latent frame (0: images only)
    # Wan2.2 A14B: two denoisers of ``trained_params_b`` each (high- and low-noise experts); one runs per step
    experts: int = 1
    image_encoder_params_b: float = 0.0  # I2V: the CLIP image encoder, run (like the text encoder) before the DiT
    aliases: tuple[str, ...] = ()

    @property
    def is_video(self) -> bool:
        return self.frames_per_latent > 0

    def latent_frames(self, frames: int) -> int:
        """Latent frames of a clip: a causal 3D VAE keeps the first frame and folds the rest by 4."""
        if not self.is_video or frames <= 1:
            return 1
        return 1 + (frames - 1) // self.frames_per_latent

    def window_tokens(self, frames: int, width: int, height: int) -> int:
        """Latent tokens of one ``width`` x ``height`` window of ``frames`` frames (a bucket of the data):
        latent frames x patches, each side cut to whole patches as the VAE and the patch embedding do."""
        if not self.patch_px:
            return 0
        return self.latent_frames(frames) * (height // self.patch_px) * (width // self.patch_px)

    def image_tokens(self, resolution: int, frames: int = 1) -> float:
        """Latent tokens the denoiser sees for one sample: patches per frame x latent frames."""
        if not self.patch_px:
            return 0.0
        return (resolution / self.patch_px) ** 2 * self.latent_frames(frames)


@dataclass(frozen=True)
class LLMArch:
    """A decoder-only transformer, from its config.json. Sizes in elements, not bytes."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    gated_mlp: bool = True
    params_override: float | None = None
    license: License = field(default_factory=lambda: License("unknown (check the model card)", None, True))

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        h, q, kv, i = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        shapes = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h)}
        if self.gated_mlp:
            shapes |= {"gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}
        else:
            shapes |= {"up_proj": (h, i), "down_proj": (i, h)}
        return shapes

    @property
    def linear_params(self) -> float:
        """Parameters in the blocks' linear layers (what 4-bit quantisation shrinks)."""
        if self.params_override:
            return self.params_override - self.embedding_params
        return self.layers * sum(a * b for a, b in self.linear_shapes().values())

    @property
    def embedding_params(self) -> float:
        """Input embedding plus LM head (kept in 16 bits even under QLoRA)."""
        return self.vocab * self.hidden * (1 if self.tied else 2)

    @property
    def params(self) -> float:
        if self.params_override:
            return self.params_override
        norms = self.layers * 2 * self.hidden + self.hidden
        return self.linear_params + self.embedding_params + norms

    def lora_shapes(self, targets: str | list[str] | tuple[str, ...]) -> list[tuple[int, int]]:
        """(in, out) of each linear a layer wraps in LoRA."""
        shapes = self.linear_shapes()
        if targets == "all-linear":
            return list(shapes.values())
        names = [targets] if isinstance(targets, str) else list(targets)
        known = [shapes[n] for n in names if n in shapes]
        # Unknown names (e.g. 'query_key_value' on BLOOM): count them as attention projections.
        return known or [shapes["q_proj"]] * len(names)

    def lora_params(self, r: int, targets: str | list[str] | tuple[str, ...]) -> float:
        return self.layers * sum(r * (i + o) for i, o in self.lora_shapes(targets))


# ----------------------------------------------------------------------------- loading


def _license(entry: dict[str, Any]) -> License:
    return License(str(entry.get("license", "unknown")), entry.get("gated"), bool(entry.get("commercial", True)))


@cache
def load_models() -> tuple[Snapshot, tuple[ImageModel, ...], tuple[tuple[str, tuple[str, ...], dict, dict], ...]]:
    snap, raw = load_data("models")
    images = []
    for m in raw["image_models"]:
        act = m["activations_gb_at_ref"]
        images.append(
            ImageModel(
                key=m.get("key") or m["aliases"][0],
                name=m["name"],
                family=m["family"],
                variant=m.get("variant"),
                kind=m["kind"],
                trained_params_b=float(m["trained"]["params_b"]),
                text_encoder_params_b=float(m["text_encoder"]["params_b"]),
                vae_params_b=float(m["vae_params_b"]),
                download_gb=float(m["download_gb"]),
                lora_params_per_rank_m=float(m["lora_params_per_rank_m"]),
                ref_resolution=int(m["ref_resolution"]),
                activations_gc_gb=float(act["checkpointing"]),
                activations_full_gb=float(act["no_checkpointing"]),
                vae_encode_gb=float(m["vae_encode_gb_at_ref"]),
                default_dtype=m["default_dtype"],
                license=_license(m),
                fwd_tflops_at_ref=m.get("fwd_tflops_at_ref"),
                attn_tflops_at_ref=float(m.get("attn_tflops_at_ref", 0.0)),
                vae_encode_tflops_at_ref=float(m.get("vae_encode_tflops_at_ref", 0.0)),
                kernels_per_fwd=int(m.get("kernels_per_fwd", 1000)),
                traffic_gb_at_ref=_pair(m.get("traffic_gb_at_ref")),
                traffic_mb_per_token=_pair(m.get("traffic_mb_per_token")),
                patch_px=m.get("patch_px"),
                token_params_b=m.get("token_params_b"),
                text_tokens=int(m.get("text_tokens", 0)),
                blocks=m.get("blocks"),
                hidden=int(m.get("hidden", 0)),
                attn_blocks=int(m.get("attn_blocks", 0)),
                joint_text=bool(m.get("joint_text", True)),
                frames_per_latent=int(m.get("frames_per_latent", 0)),
                experts=int(m.get("experts", 1)),
                image_encoder_params_b=float((m.get("image_encoder") or {}).get("params_b", 0.0)),
                aliases=tuple(str(a) for a in m.get("aliases", [])),
            )
        )
    llms = tuple(
        (e["name"], tuple(e.get("aliases", [])), e["config"], e) for e in raw["llms"]
    )
    return snap, tuple(images), llms


def hub_id(name: str) -> str | None:
    """The hub id a catalog LLM alias stands for (``llama-3.1-8b`` -> ``meta-llama/Llama-3.1-8B``).

    The first alias of the entry that looks like a hub id (has a ``/``) is the one used, so an
    alias and the hub id it names load the same files.
    """
    key = normalise(name)
    _, _, llms = load_models()
    for entry_name, aliases, _cfg, _entry in llms:
        if key in {normalise(a) for a in (*aliases, entry_name)}:
            return next((a for a in aliases if "/" in a), None)
    return None


def close_hub_ids(model_id: str) -> list[str]:
    """The catalog's hub ids spelled closest to ``model_id`` (a mistyped id: ``Llama-3.1-8B-Instrct``)."""
    import difflib

    _, _, llms = load_models()
    known = [a for _n, aliases, _c, _e in llms for a in aliases if "/" in a]
    lowered = {k.lower(): k for k in known}
    return [lowered[m] for m in difflib.get_close_matches(model_id.lower(), list(lowered), n=1, cutoff=0.85)
            if lowered[m] != model_id]


def llm_from_config(cfg: dict[str, Any], name: str = "model", entry: dict[str, Any] | None = None) -> LLMArch:
    """Build an :class:`LLMArch` from a transformers config dict (llama, mistral, qwen, gemma, bloom...)."""
    text = cfg.get("text_config") or cfg
    try:
        hidden = int(text.get("hidden_size") or text.get("n_embd") or text["d_model"])
        layers = int(text.get("num_hidden_layers") or text.get("n_layer") or text["num_layers"])
        heads = int(text.get("num_attention_heads") or text.get("n_head") or text["num_heads"])
    except KeyError as exc:
        raise PlanError(
            f"{name}: config.json lacks {exc} (hidden size, layers or heads)",
            hint="pass model.family and a known model id, or a transformers model folder",
        ) from None
    kv = int(text.get("num_key_value_heads") or heads)
    head_dim = int(text.get("head_dim") or hidden // heads)
    model_type = str(text.get("model_type", "")).lower()
    gated_mlp = model_type not in {"bloom", "gpt2", "gpt_neox", "opt", "falcon", "phi"}
    inter = int(text.get("intermediate_size") or text.get("n_inner") or text.get("ffn_dim") or 4 * hidden)
    vocab = int(text.get("vocab_size", 32000))
    tied = bool(text.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False)))
    return LLMArch(
        name=name, hidden=hidden, layers=layers, heads=heads, kv_heads=kv, head_dim=head_dim,
        intermediate=inter, vocab=vocab, tied=tied, gated_mlp=gated_mlp,
        license=_license(entry) if entry else License("unknown (check the model card)", None, True),
    )


def _local_config(model_id: str) -> Path | None:
    """config.json of a local folder, or of a hub id already in the Hugging Face cache."""
    p = Path(model_id).expanduser()
    if p.is_dir() and (p / "config.json").is_file():
        return p / "config.json"
    if "/" in model_id and not p.exists():
        hub = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", "~/.cache/huggingface")) / "hub")
        snaps = hub.expanduser() / f"models--{model_id.replace('/', '--')}" / "snapshots"
        if snaps.is_dir():
            for snap in sorted(snaps.iterdir(), key=lambda s: s.stat().st_mtime, reverse=True):
                if (snap / "config.json").is_file():
                    return snap / "config.json"
    return None


def _hub_config(model_id: str) -> Path | None:
    """A hub id the catalog does not know: its config.json, fetched alone (no weights, no tokenizer)
    into the Hugging Face cache, the way lorapod.tokenizer fetches tokenizer files: HF_ENDPOINT,
    HF_TOKEN, and offline (HF_HUB_OFFLINE / LORAPOD_OFFLINE) meaning the cache only. None when it is
    not a hub id (or the repo has no config.json); a PlanError that says what to do otherwise."""
    p = Path(model_id).expanduser()
    if model_id.count("/") != 1 or model_id.startswith((".", "/", "~")) or p.exists() or is_builtin(model_id):
        return None
    try:
        import huggingface_hub as hub
        from huggingface_hub import errors as hf_errors
    except ImportError as exc:
        raise PlanError(f"planning {model_id} needs its config.json from the hub, and huggingface_hub is not installed",
                        hint="pip install 'lorapod[llm]', or point model.id at a local folder with config.json") from exc
    from lorapod.home import hub_unreachable, offline

    local_only = offline()
    unreachable = None if local_only else hub_unreachable()
    try:
        return Path(hub.hf_hub_download(model_id, "config.json", local_files_only=local_only or bool(unreachable),
                                        token=os.environ.get("HF_TOKEN") or None,
                                        endpoint=os.environ.get("HF_ENDPOINT") or None))
    except hf_errors.GatedRepoError as exc:
        raise PlanError(f"{model_id} is gated: the hub refused its config.json without access",
                        hint="accept the licence on the model's hub page, then set HF_TOKEN") from exc
    except hf_errors.RepositoryNotFoundError as exc:
        raise PlanError(f"no model {model_id} on the hub (or it is private), and the catalog does not know it",
                        hint="check the spelling; private models need HF_TOKEN; or point model.id at a local "
                             "folder with a config.json") from exc
    except hf_errors.LocalEntryNotFoundError as exc:
        close = close_hub_ids(model_id)
        spelled = f"did you mean {', '.join(repr(c) for c in close)}? " if close else ""
        if unreachable:
            err = PlanError(f"the Hugging Face hub cannot be reached ({unreachable}) and {model_id}'s config.json is "
                            "not in its cache",
                            hint=f"{spelled}point model.id at a local folder with a config.json (--set "
                                 "model.id=PATH), or plan where the hub can be reached")
            err.near = close  # type: ignore[attr-defined]  # find_model merges them with the catalog's into one list
            raise err from exc
        if local_only:
            raise PlanError(f"offline, and {model_id}'s config.json is not in the Hugging Face cache",
                            hint=f"on a machine with internet run `huggingface-cli download {model_id} config.json`, "
                                 "copy the cache here, or point model.id at a local folder") from exc
        raise PlanError(f"cannot fetch {model_id}'s config.json: the hub cannot be reached and it is not cached",
                        hint="check the network, or point model.id at a local folder with a config.json") from exc
    except hf_errors.EntryNotFoundError:
        return None  # a repo without config.json (not a transformers model): "unknown model" below
    except (OSError, ValueError) as exc:
        raise PlanError(f"cannot fetch {model_id}'s config.json ({type(exc).__name__})",
                        hint="check the network, or point model.id at a local folder with a config.json") from exc


def _diffusers_family(model_id: str) -> str | None:
    index = Path(model_id).expanduser() / "model_index.json"
    if not index.is_file():
        return None
    try:
        raw = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return families.family_of_index(raw)  # the engine's reading too (engine/diffusion/families/detect.py)


def wan_block_params(cfg: dict[str, Any]) -> tuple[int, int]:
    """(parameters per block, parameters outside the blocks) from a WanTransformer3DModel config.json."""
    d = cfg.get("num_attention_heads", 40) * cfg.get("attention_head_dim", 128)
    ffn = cfg.get("ffn_dim", 13824)
    per_block = 8 * d * d + 2 * d * ffn + 12 * d + ffn  # 2 attentions x (q, k, v, o), feed-forward, biases/norms
    text, freq = cfg.get("text_dim", 4096), cfg.get("freq_dim", 256)
    patch = 1
    for s in cfg.get("patch_size", (1, 2, 2)):
        patch *= s
    outside = text * d + d * d + freq * d + d * d + 6 * d * d + 2 * patch * cfg.get("in_channels", 16) * d
    return per_block, outside


def wan_model_from_config(base: ImageModel, cfg: dict[str, Any], *, spatial: int = 8, experts: int = 1) -> ImageModel:
    """A Wan catalog row resized to a transformer's own config.json (what the memory model needs:
    parameters, blocks, hidden size, LoRA size, patch), with ``experts`` transformers. The rest (text
    encoder, VAE, licence) is ``base``'s. The planner and the engine both size a Wan folder this way."""
    per_block, outside = wan_block_params(cfg)
    n = int(cfg.get("num_layers", 40))
    d = cfg.get("num_attention_heads", 40) * cfg.get("attention_head_dim", 128)
    ffn = cfg.get("ffn_dim", 13824)
    # LoRA on every block linear (engine/diffusion/families/wan.py: WAN_TARGETS): per rank, the
    # 8 attention projections d -> d (A and B: 2d each) and the feed-forward in and out (d + ffn each)
    lora_per_rank = n * (8 * 2 * d + 2 * (d + ffn))
    patch = cfg.get("patch_size", (1, 2, 2))
    return replace(base, trained_params_b=(n * per_block + outside) / 1e9, lora_params_per_rank_m=lora_per_rank / 1e6,
                   blocks=n, attn_blocks=n, hidden=d, patch_px=spatial * int(patch[1]), experts=experts,
                   token_params_b=None)


def _wan_folder(model_id: str, named: ImageModel | None, images: tuple[ImageModel, ...], family: str,
                variant: str | None) -> ImageModel | None:
    """A local Wan diffusers folder sized by its own transformer config (None for anything else)."""
    folder = Path(model_id).expanduser()
    cfg_file = folder / "transformer" / "config.json"
    found = _diffusers_family(model_id) if folder.is_dir() else None
    if found not in families.VIDEO or not cfg_file.is_file():
        return None
    fam = family if family in families.VIDEO else found
    base = named or next((m for m in images if m.family == fam and (not variant or
                          normalise(m.variant or "") == normalise(variant))), None)
    if base is None:
        return None
    try:
        cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
        vae = folder / "vae" / "config.json"
        spatial = int(json.loads(vae.read_text(encoding="utf-8")).get("scale_factor_spatial", 8)) if vae.is_file() else 8
    except (OSError, ValueError) as exc:
        raise PlanError(f"cannot read the Wan configs of {folder}: {exc}",
                        hint="check transformer/config.json and vae/config.json") from exc
    experts = 2 if (folder / "transformer_2" / "config.json").is_file() else 1
    return wan_model_from_config(base, cfg, spatial=spatial, experts=experts)


def named_image_model(model_id: str) -> ImageModel | None:
    """The catalog row whose name or an alias is ``model_id`` (or its file or folder name), else None."""
    key = normalise(model_id)
    base = normalise(Path(model_id).name) if ("/" in model_id or "." in model_id) else key
    for m in load_models()[1]:
        names = {normalise(a) for a in (*m.aliases, m.name, m.key)}
        if key in names or base in names:
            return m
    return None


def find_model(model_id: str, family: str = "auto", variant: str | None = None) -> ImageModel | LLMArch:
    """Resolve a spec's model to a catalog entry or an LLM architecture.

    Order: image aliases by id (or file name), then the family + variant, then an LLM
    config.json on disk, then built-in LLM entries. Unknown: PlanError with close names.
    """
    _, images, llms = load_models()
    key = normalise(model_id)
    named = named_image_model(model_id)
    local = _wan_folder(model_id, named, images, family, variant)  # a Wan folder: its own sizes
    if local is not None:
        return local
    if named is not None:
        return named
    found = _diffusers_family(model_id)
    if family == "auto":
        family = found or family
    if found in families.NOT_TRAINED.values():  # the engine refuses it too, whatever the spec's family
        cls = next(c for c, f in families.NOT_TRAINED.items() if f == found)
        raise PlanError(f"{model_id} is a {cls} model (family {found}), which lorapod does not train or plan",
                        hint=f"lorapod trains {', '.join(f.title for f in families.FAMILIES.values())}; "
                             "for FLUX.2 use a klein model (black-forest-labs/FLUX.2-klein-base-4B or -9B)")
    if family not in ("auto", "llm"):
        members = [m for m in images if m.family == family]
        if variant:
            exact = [m for m in members if normalise(m.variant or "") == normalise(variant)]
            if not exact:
                known = [m.variant for m in members if m.variant]
                raise PlanError(
                    f"unknown variant {variant!r} for family {family}",
                    hint=f"known variants: {', '.join(known)}" if known else None,
                )
            return exact[0]
        if members:
            return members[0]
    cfg_path = _local_config(model_id)
    if cfg_path is not None:
        try:
            cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise PlanError(f"cannot read {cfg_path}: {exc}") from exc
        entry = next((e for _, al, _, e in llms if key in {normalise(a) for a in al}), None)
        return llm_from_config(cfg, name=model_id, entry=entry)
    for name, aliases, cfg, entry in llms:
        if key in {normalise(a) for a in (*aliases, name)}:
            arch = llm_from_config(cfg, name=name, entry=entry)
            if model_id in entry.get("not_gated_aliases", []):
                arch = LLMArch(**{**arch.__dict__, "license": License(arch.license.name, False, arch.license.commercial)})
            return arch
    every = {a: next((x for x in m.aliases if "/" in x), m.name) for m in images for a in (m.name, *m.aliases)}
    every |= {a: next((x for x in al if "/" in x), name) for name, al, _, _ in llms for a in (name, *al)}
    try:
        hub_cfg = _hub_config(model_id) if family in ("auto", "llm") else None
    except PlanError as exc:  # not on the hub, or not reachable: a typo of a catalog name is likelier
        cached = list(getattr(exc, "near", []))  # ids in the Hugging Face cache close to it: the likeliest
        near = list(dict.fromkeys([*cached, *closest_canonical(model_id, every)]))[:3]
        if near:  # one list, however many places the names came from
            rest = (exc.hint or "").removeprefix(f"did you mean {', '.join(repr(c) for c in cached)}? " if cached else "")
            exc.hint = f"did you mean {', '.join(repr(n) for n in near)}? " + rest
        raise
    if hub_cfg is not None:
        try:
            cfg = json.loads(hub_cfg.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise PlanError(f"cannot read {model_id}'s config.json from the hub: {exc}") from exc
        if isinstance(cfg, dict) and (cfg.get("model_type") or cfg.get("architectures")):
            return llm_from_config(cfg, name=model_id)
    if is_builtin(model_id):
        raise PlanError(
            f"{model_id!r} is lorapod's built-in demo model: there is no GPU to plan or rent for it",
            hint="it trains on this machine's CPU in seconds: run `lorapod demo`, or `lorapod train SPEC`; "
            "plan a job for a real base model (examples/llm-chat-lora.yaml, examples/sdxl-object-lora.yaml)",
        )
    near = closest_canonical(model_id, every)
    hint = (f"did you mean {', '.join(repr(n) for n in near)}? " if near else "") + (
        "For another LLM, point model.id at a local folder with a config.json."
    )
    raise PlanError(f"unknown model {model_id!r} (family {family})", hint=hint)


def v_prediction_name(model_id: str) -> str | None:
    """The catalog's name for a v-prediction checkpoint whose hub id or file name matches, else None."""
    import re

    _, raw = load_data("models")
    local = Path(model_id).expanduser()
    name = local.name if local.exists() or local.suffix else model_id  # a folder's own name, not its parents
    for entry in raw.get("v_prediction_models", []):
        if re.search(entry["pattern"], name, re.IGNORECASE):
            return str(entry["name"])
    return None


def _pair(raw: dict[str, Any] | None) -> tuple[float, float]:
    """(forward, backward) of a counted figure, (0, 0) when the catalog has none."""
    if not raw:
        return 0.0, 0.0
    return float(raw["forward"]), float(raw["backward"])
