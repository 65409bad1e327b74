"""Wan's memory savers and file layout (the family itself is ``engine/diffusion/families/wan.py``).

- ``store_fp8``: the blocks' frozen Linear weights in float8 (Ada/Hopper), as the image engine does.
- ``BlockSwap``: the frozen weights of the last N blocks live in CPU RAM and visit the GPU only
  for their own forward (and its recomputation under gradient checkpointing, which it requires).
- ``check_fits``: refuse, before anything loads, a job that would not fit the GPU even with the
  most blocks swapped.
- ``comfy_name``: the original Wan module names (``blocks.0.self_attn.q``) that ComfyUI's loader,
  musubi-tuner and diffusers' converters use, for the ``lora_unet_*`` file.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from lorapod.errors import HardwareError, ModelLoadError

# ----------------------------------------------------------------------------- memory


def store_fp8(transformer: torch.nn.Module) -> int:
    """float8 storage for the frozen Linear weights inside ``blocks.N`` (the image engine's rule,
    engine/diffusion/fp8.py, with Wan's block names); upcast per call by ``Float8Linear``."""
    from lorapod.engine.diffusion.fp8 import store_fp8 as store

    return store(transformer, lambda name: name.startswith("blocks."))


class BlockSwap:
    """Keep the frozen weights of the last ``n`` transformer blocks in CPU RAM (pinned) and bring
    each block's weights to ``device`` just for its forward. The weights are frozen, so the CPU copy
    is made once and "offloading" only drops the GPU copy: nothing is copied back. LoRA weights
    (trainable) never move, so the optimizer and gradients are untouched. Under gradient
    checkpointing the backward pass recomputes the block's forward, which runs the same hooks;
    without it autograd would keep the GPU copies alive and nothing would be saved, so the caller
    turns checkpointing on."""

    def __init__(self, blocks: torch.nn.ModuleList, n: int, device: torch.device) -> None:
        self.device = torch.device(device)
        self.blocks = list(blocks)[len(blocks) - n :] if n > 0 else []
        self.moves = 0
        self._hooks = []
        self._cpu: dict[int, tuple[torch.nn.Parameter, torch.Tensor]] = {}
        pin = self.device.type == "cuda"
        for b in self.blocks:
            for prm in b.parameters():
                if not prm.requires_grad:
                    host = prm.data.to("cpu")
                    self._cpu[id(prm)] = (prm, host.pin_memory() if pin else host)
                    prm.data = self._cpu[id(prm)][1]
            self._hooks.append(b.register_forward_pre_hook(lambda m, args: self._load(m)))
            self._hooks.append(b.register_forward_hook(lambda m, args, out: self._drop(m)))

    def _frozen(self, block: torch.nn.Module):
        return [self._cpu[id(p)] for p in block.parameters() if id(p) in self._cpu]

    def _load(self, block: torch.nn.Module) -> None:
        for prm, host in self._frozen(block):
            prm.data = host.to(self.device, non_blocking=True)
        self.moves += 1

    def _drop(self, block: torch.nn.Module) -> None:
        for prm, host in self._frozen(block):
            prm.data = host
        self.moves += 1

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()
        for b in self.blocks:
            self._load(b)


def component_config(model_id: str, revision: str | None = None, sub: str = "transformer") -> dict:
    """A component's config.json (transformer, vae: a few hundred bytes), read before any weight is loaded."""
    p = Path(model_id).expanduser()
    if p.is_dir():
        f = p / sub / "config.json"
        if not f.is_file():
            raise ModelLoadError(f"{p} has no {sub}/config.json", hint="point model.id at a diffusers Wan folder")
        return json.loads(f.read_text(encoding="utf-8"))
    try:
        from huggingface_hub import hf_hub_download

        return json.loads(Path(hf_hub_download(model_id, f"{sub}/config.json", revision=revision)).read_text())
    except Exception as exc:
        raise ModelLoadError(f"could not read {sub}/config.json of {model_id} ({exc.__class__.__name__}: {exc})",
                             hint="check the id and your network") from exc


def block_params(cfg: dict) -> tuple[int, int]:
    """(parameters per block, parameters outside the blocks) from a WanTransformer3DModel config."""
    d = cfg.get("num_attention_heads", 40) * cfg.get("attention_head_dim", 128)
    ffn = cfg.get("ffn_dim", 13824)
    per_block = 8 * d * d + 2 * d * ffn + 12 * d + ffn  # 2 attentions x (q, k, v, o), feed-forward, biases/norms
    text, freq = cfg.get("text_dim", 4096), cfg.get("freq_dim", 256)
    patch = 1
    for s in cfg.get("patch_size", (1, 2, 2)):
        patch *= s
    outside = text * d + d * d + freq * d + d * d + 6 * d * d + 2 * patch * cfg.get("in_channels", 16) * d
    return per_block, outside


def vram_need_gb(cfg: dict, *, fp8: bool, blocks_to_swap: int, tokens: int, rank: int, experts: int = 1) -> float:
    """A floor on the GPU memory a Wan LoRA step needs: resident base weights (blocks not swapped,
    plus one block in flight), LoRA weights with AdamW state, the checkpointed block inputs, one
    block's recomputed activations and ~1.5 GB of CUDA context and workspace. Floors, not the
    planner's estimate (``lorapod plan``): if even this does not fit, nothing will.

    ``experts``: transformers kept on the GPU (Wan2.2 trains both of its experts resident; one runs
    per step, so activations count once)."""
    per_block, outside = block_params(cfg)
    n_blocks = cfg.get("num_layers", 40)
    d = cfg.get("num_attention_heads", 40) * cfg.get("attention_head_dim", 128)
    ffn = cfg.get("ffn_dim", 13824)
    weight_bytes = 1 if fp8 else 2
    resident = (outside * 2 + (n_blocks - blocks_to_swap + (1 if blocks_to_swap else 0)) * per_block * weight_bytes)
    lora = n_blocks * rank * (8 * 2 * d + 2 * (d + ffn)) * 16  # fp32 weight + grad + two Adam moments
    ckpt = n_blocks * tokens * d * 2
    working = tokens * (10 * d + 2 * ffn) * 2
    return (experts * (resident + lora) + ckpt + working) / 1e9 + 1.5


def resident_experts(model_id: str, revision: str | None, which: str) -> int:
    """How many transformers the engine keeps on the GPU: 2 when a Wan2.2 A14B model (it has a
    ``transformer_2``) trains both experts, else 1. An unreadable index counts as 1."""
    if which != "both":
        return 1
    try:
        component_config(model_id, revision, "transformer_2")
    except ModelLoadError:
        return 1
    return 2


def latent_tokens(frames: int, width: int, height: int, cfg: dict, spatial: int = 8) -> int:
    """Transformer tokens of one window: latent frames x latent patches (VAE /8, Wan2.2's 5B VAE /16)."""
    pt, ph, pw = cfg.get("patch_size", (1, 2, 2))
    return ((frames - 1) // 4 + 1) // pt * (height // spatial // ph) * (width // spatial // pw)


def check_fits(cfg: dict, gpu_gb: float, *, fp8: bool, blocks_to_swap: int, tokens: int, rank: int,
               what: str = "this job", experts: int = 1) -> None:
    """HardwareError when the job cannot fit even with every block but one swapped; the hint gives
    the settings that would help."""
    n_blocks = cfg.get("num_layers", 40)
    most = n_blocks - 1
    floor = vram_need_gb(cfg, fp8=fp8, blocks_to_swap=most, tokens=tokens, rank=rank, experts=experts)
    if floor > gpu_gb:
        raise HardwareError(
            f"{what} needs at least {floor:.1f} GB of GPU memory even with {most} of {n_blocks} blocks swapped to "
            f"CPU ({tokens} latent tokens per sample); this GPU has {gpu_gb:.1f} GB",
            hint=("train.experts: high_noise or low_noise (one expert per run), " if experts > 1 else "")
                 + "use fewer/shorter data.target_frames or a lower data.resolution"
                 + ("" if fp8 else ", model.dtype: fp8 on an Ada/Hopper GPU") + ", or a larger GPU (lorapod plan lists them)")
    need = vram_need_gb(cfg, fp8=fp8, blocks_to_swap=blocks_to_swap, tokens=tokens, rank=rank, experts=experts)
    if need > gpu_gb:
        k = next(k for k in range(blocks_to_swap, n_blocks) if
                 vram_need_gb(cfg, fp8=fp8, blocks_to_swap=k, tokens=tokens, rank=rank, experts=experts) <= gpu_gb)
        raise HardwareError(f"{what} needs about {need:.1f} GB with train.blocks_to_swap: {blocks_to_swap}; "
                            f"this GPU has {gpu_gb:.1f} GB",
                            hint=f"set train.blocks_to_swap: {k} (or more) and train.gradient_checkpointing: true")


# ----------------------------------------------------------------------------- file layout

_ATTN = {"to_q": "q", "to_k": "k", "to_v": "v", "to_out.0": "o", "add_k_proj": "k_img", "add_v_proj": "v_img"}
_FFN = {"net.0.proj": "0", "net.2": "2"}
_DIFFUSERS_PATH = re.compile(r"^blocks\.(\d+)\.(attn1|attn2|ffn)\.(.+)$")


def comfy_name(module: str) -> str:
    """diffusers module path -> original Wan path: ``blocks.3.attn1.to_q`` -> ``blocks.3.self_attn.q``,
    ``blocks.3.ffn.net.0.proj`` -> ``blocks.3.ffn.0``. ComfyUI maps ``lora_unet_`` + this path with
    dots as underscores onto ``diffusion_model.<path>.weight`` (comfy/lora.py, model_lora_keys_unet)."""
    m = _DIFFUSERS_PATH.match(module)
    if not m:
        raise ValueError(f"no ComfyUI name for Wan module {module!r}")
    i, part, rest = m.groups()
    if part == "ffn":
        return f"blocks.{i}.ffn.{_FFN[rest]}"
    return f"blocks.{i}.{'self_attn' if part == 'attn1' else 'cross_attn'}.{_ATTN[rest]}"


def to_comfy(peft_sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A transformer's PEFT state dict renamed to Wan module paths (still ``.lora_A/B.weight``)."""
    out = {}
    for k, v in peft_sd.items():
        for tag in (".lora_A.weight", ".lora_B.weight"):
            if k.endswith(tag):
                out[comfy_name(k[: -len(tag)]) + tag] = v
    return out
