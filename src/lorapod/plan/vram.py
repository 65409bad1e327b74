"""Peak GPU memory of a LoRA job, with its breakdown, and the cheapest change that makes it fit.

The model is additive: frozen base weights at their precision, the LoRA parameters with their
gradients and optimizer states, activations (by batch and sequence length or resolution,
with or without gradient checkpointing), whatever is not cached (text encoders, VAE), minus
what block swap keeps in CPU RAM, plus the CUDA context and the allocator's slack. Each term and its assumption is in
docs/planner.md, next to the published figures it was checked against. Sizes are GiB (what
nvidia-smi shows, and what a "24 GB" card holds).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Literal

from lorapod.catalog.gpus import GPU
from lorapod.catalog.models import ImageModel, LLMArch
from lorapod.errors import HardwareError
from lorapod.plan.frameworks import framework
from lorapod.spec import JobSpec

GiB = 1024**3

# Bytes per parameter of the frozen base. nf4: 4 bits plus bitsandbytes' double-quantised block
# constants (~0.127 bit/param, QLoRA paper), i.e. 0.516 bytes; gptq: 4 bits plus a 16-bit scale
# and zero per group of 128 (published GPTQ int4 checkpoints, e.g. Qwen's Q-LoRA).
BYTES_PER_PARAM = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "nf4": 0.516, "gptq": 0.53}
# LoRA weights and gradients are fp32 (PEFT upcasts adapters); AdamW keeps two fp32 moments,
# 8-bit AdamW two 8-bit moments; Adafactor factored second moments (a fraction of a byte).
OPTIMIZER_BYTES = {"adamw": 8.0, "adamw_8bit": 2.0, "adafactor": 0.5}
LORA_BYTES = 4.0 + 4.0
# Memory a card holds beyond the tensors: the CUDA context and the libraries' handles and
# workspaces (fixed), and what PyTorch's caching allocator keeps reserved but not allocated
# (fragmentation; a share of the rest). Assumptions, named by the parts of `lorapod plan --explain`.
OVERHEAD_FIXED_GB = 0.75
OVERHEAD_FRACTION = 0.05
CONTEXT_PART = "CUDA context, workspaces"
SLACK_PART = "allocator slack"
# What each way of reading a peak leaves out: nvidia-smi ("device") sees everything;
# torch.cuda.max_memory_reserved() no context; max_memory_allocated() no slack either.
NOT_COUNTED_BY = {"device": (), "reserved": (CONTEXT_PART,), "allocated": (CONTEXT_PART, SLACK_PART)}
# A card is "tight" when less than this share of it is left free.
TIGHT_FRACTION = 0.10
# LLM activations per token per layer without checkpointing, in elements: about 10 x hidden
# (norm inputs, q/k/v/o inputs, SDPA output, residuals) + 4 x intermediate (SwiGLU inputs and
# outputs), in bf16. With checkpointing only each layer's input (1 x hidden) is kept, plus one
# layer recomputed at a time. The logits term is the trainer's own (plan/frameworks.py).
# The (sequence x sequence) terms depend on the attention path that runs (Settings.attention,
# engine/attention.py): a padding-free row (lorapod's varlen SDPA, flex_attention, FlashAttention)
# keeps nothing of that size. An explicit additive (B, 1, L, L) mask in the compute dtype is built
# once a step and shared by every layer (SDPA takes a mask of the query's dtype as it is): B x L^2 x
# 2 bytes, with or without checkpointing. Eager attention keeps each layer's softmax output in fp32
# and its bf16 copy for the value matmul: 6 bytes per (head, query, key), every layer without
# checkpointing, the layer being recomputed with it; plus its own additive mask. Counted with
# torch.autograd.graph.saved_tensors_hooks on a tiny Llama (tests/test_plan_attention.py).
ATTN_PATHS = ("padding_free", "mask", "eager")
EAGER_PROB_BYTES = 6
LLM_ACT_HIDDEN = 10
LLM_ACT_INTER = 4
# Diffusion transformers: tensors saved per token per block without checkpointing, in units of
# the hidden size (norms, q/k/v, attention output, the 4x MLP before and after its activation,
# modulation and residuals: about 18). With checkpointing: each block's input, plus one block.
DIT_ACT_HIDDEN = 18
# lorapod's engine computes the loss at label positions only; with assistant-only labels about
# half the tokens of a chat are labels (an assumption; a chat file's own share can differ).
ASSISTANT_LABEL_FRACTION = 0.5

Verdict = Literal["fits", "tight", "does-not-fit"]


@dataclass(frozen=True)
class Settings:
    """The knobs the estimate depends on, taken from a spec; suggestions change them."""

    base_dtype: str  # fp32 | bf16 | fp16 | fp8 | int8 | nf4 | gptq
    r: int
    targets: str | tuple[str, ...]
    optimizer: str
    gradient_checkpointing: bool
    batch: int
    seq_len: int = 2048
    resolution: int | tuple[int, ...] = 1024  # a tuple: a mix of buckets (variants() splits it)
    cache_latents: bool = True
    cache_text_encoder_outputs: bool = True
    train_text_encoder: bool = False
    blocks_to_swap: int = 0
    # Clips: frames per sample (1 = still images). A tuple (like resolution's) is a mix of buckets.
    frames: int | tuple[int, ...] = 1
    # The trainer whose memory layout and speed apply (plan/frameworks.py).
    framework: str = "lorapod"
    grad_accum: int = 1
    # Share of tokens that reach the LM head (lorapod's engine skips non-label positions).
    label_fraction: float = 1.0
    # Text tokens a DiT sees per sample (0 = the model's own: 512 for FLUX). Trainers that cache
    # shorter prompt embeddings (77 tokens in the diffusers QLoRA scripts) attend over fewer.
    text_tokens: int = 0
    # Matmuls in fp8 on fp8 tensor cores (Transformer Engine, torchao float8 training), whatever the
    # base's storage: a published run's setting; lorapod's own jobs run bf16 matmuls.
    fp8_matmuls: bool = False
    # Wan2.2 A14B (train.experts): "both" keeps both experts and their LoRAs on the GPU, as lorapod's
    # engine places every trained expert; one expert alone leaves the other in CPU RAM.
    experts: str = "both"
    # Latent tokens of the largest sample, when the data are known (0 = from resolution and frames,
    # square): the engine's fit check passes the tokens of its real buckets (ImageModel.window_tokens).
    image_tokens: int = 0
    # LLMs, lorapod's engine: how packed rows reach attention (ATTN_PATHS; engine/attention.py).
    # padding_free: no L x L tensor, causal FLOPs; mask: an explicit (B,1,L,L) mask (models with their
    # own code), full L^2 FLOPs; eager: the L x L probabilities per layer, full L^2 FLOPs.
    attention: str = "padding_free"

    @classmethod
    def from_spec(cls, spec: JobSpec, model: ImageModel | LLMArch) -> Settings:
        dtype: str = spec.model.dtype
        if spec.method.type == "qlora":
            dtype = "nf4"
        elif dtype == "auto":
            dtype = model.default_dtype if isinstance(model, ImageModel) else "bf16"
        targets = spec.method.target_modules
        # clips: the spec's 4n+1 window lengths (a mix of buckets); stills train as 1 frame
        frames: int | tuple[int, ...] = 1
        if isinstance(model, ImageModel) and model.is_video and _has_clips(spec):
            frames = tuple(spec.data.target_frames)
            frames = frames[0] if len(frames) == 1 else frames
        return cls(
            base_dtype=dtype,
            r=spec.method.r,
            targets=targets if isinstance(targets, str) else tuple(targets),
            optimizer=spec.train.optimizer,
            gradient_checkpointing=spec.train.gradient_checkpointing,
            batch=spec.train.micro_batch_size,
            seq_len=spec.data.sequence_len,
            resolution=spec.data.resolution,
            cache_latents=spec.data.cache_latents,
            cache_text_encoder_outputs=spec.data.cache_text_encoder_outputs,
            train_text_encoder=spec.method.train_text_encoder,
            blocks_to_swap=spec.train.blocks_to_swap,
            frames=tuple(frames) if isinstance(frames, list | tuple) else int(frames),
            framework=_default_framework(model),
            grad_accum=spec.train.grad_accum,
            label_fraction=ASSISTANT_LABEL_FRACTION if spec.data.train_on_assistant_only else 1.0,
            experts=spec.train.experts,
            attention=_attention_path(spec) if isinstance(model, LLMArch) else "padding_free",
        )

    def variants(self) -> list[Settings]:
        """One single-valued Settings per (resolution, frames) bucket of a mix; itself if none."""
        res = self.resolution if isinstance(self.resolution, tuple) else (self.resolution,)
        frm = self.frames if isinstance(self.frames, tuple) else (self.frames,)
        if len(res) == 1 and len(frm) == 1:
            return [self]
        return [replace(self, resolution=r, frames=f) for r, f in itertools.product(res, frm)]


def _attention_path(spec: JobSpec) -> str:
    """The engine's attention path for an LLM spec (engine/attention.py ``choose``, on the GPU the
    plan is for): eager when asked for; an explicit mask for a model with its own code (remote
    code may ignore restarting position ids); padding-free otherwise (sdpa, flex, flash; a model
    without sdpa such as Gemma 2 runs flex_attention on CUDA)."""
    if spec.train.attention == "eager":
        return "eager"
    if spec.model.trust_remote_code:
        return "mask"
    return "padding_free"


def _default_framework(model: ImageModel | LLMArch) -> str:
    """lorapod trains LLMs itself; image jobs run the external trainer the recipes name."""
    if isinstance(model, LLMArch):
        return "lorapod"
    return "musubi-tuner" if model.is_video else "sd-scripts"


@dataclass(frozen=True)
class Estimate:
    """Peak memory in GiB and the terms it is made of."""

    peak_gb: float
    parts: dict[str, float]
    settings: Settings

    def verdict(self, gpu: GPU) -> Verdict:
        if self.peak_gb > gpu.vram_gb:
            return "does-not-fit"
        if gpu.vram_gb - self.peak_gb < TIGHT_FRACTION * gpu.vram_gb:
            return "tight"
        return "fits"

    def headroom_gb(self, gpu: GPU) -> float:
        return gpu.vram_gb - self.peak_gb

    def read_as(self, counter: str) -> float:
        """The peak as ``counter`` reports it: "device" (nvidia-smi; what the card must hold),
        "reserved" (torch.cuda.max_memory_reserved) or "allocated" (max_memory_allocated).
        Published peaks are read all three ways; comparing them to the device figure would count
        the context and the allocator's slack against the model."""
        return round(self.peak_gb - sum(self.parts.get(p, 0.0) for p in NOT_COUNTED_BY[counter]), 2)


@dataclass(frozen=True)
class Suggestion:
    """A setting change, as ``--set`` arguments, and the peak it leads to."""

    change: str
    sets: tuple[str, ...]
    peak_gb: float
    cost: str = ""
    settings: Settings = field(repr=False, default=None)  # type: ignore[assignment]

    def describe(self) -> str:
        extra = f", {self.cost}" if self.cost else ""
        return f"{self.change} ({' '.join('--set ' + s for s in self.sets)}; peak {self.peak_gb:.1f} GB{extra})"


def estimate(model: ImageModel | LLMArch, s: Settings) -> Estimate:
    """Peak memory; a mix of buckets peaks at its largest one."""
    variants = s.variants()
    if len(variants) > 1:
        worst = max((estimate(model, v) for v in variants), key=lambda e: e.peak_gb)
        return Estimate(worst.peak_gb, worst.parts, s)
    parts = _image_parts(model, s) if isinstance(model, ImageModel) else _llm_parts(model, s)
    subtotal = sum(parts.values())
    parts[CONTEXT_PART] = OVERHEAD_FIXED_GB
    parts[SLACK_PART] = OVERHEAD_FRACTION * subtotal
    parts = {k: round(v, 3) for k, v in parts.items()}
    return Estimate(round(sum(parts.values()), 2), parts, s)


def _image_weights_gb(m: ImageModel, dtype: str) -> float:
    return m.trained_params_b * 1e9 * BYTES_PER_PARAM[dtype] / GiB


def resident_experts(m: ImageModel, s: Settings) -> int:
    """Denoisers on the GPU: both Wan2.2 A14B experts when both are trained, else one."""
    return m.experts if s.experts == "both" else 1


def _image_parts(m: ImageModel, s: Settings) -> dict[str, float]:
    bpp = BYTES_PER_PARAM[s.base_dtype]
    res = int(s.resolution)  # type: ignore[arg-type]
    frames = int(s.frames)  # type: ignore[arg-type]
    pixels = (res / m.ref_resolution) ** 2
    n_exp = resident_experts(m, s)
    weights = _image_weights_gb(m, s.base_dtype) * n_exp
    label = f"{m.kind}, {s.base_dtype}" + (f", {n_exp} experts" if n_exp > 1 else "")
    parts: dict[str, float] = {f"base weights ({label})": weights}
    if m.blocks and s.blocks_to_swap:
        n_swap = min(s.blocks_to_swap, m.blocks - 1)
        parts["block swap (kept in CPU RAM)"] = -weights * n_swap / m.blocks
        visiting = min(n_swap, framework(s.framework).swap_in_flight)
        if visiting:  # the block computing and the one arriving (plan/frameworks.py)
            parts["block swap (blocks in transit)"] = weights / resident_experts(m, s) * visiting / m.blocks
    if not s.cache_text_encoder_outputs or s.train_text_encoder:
        te_bpp = min(bpp, 2.0) if s.base_dtype != "fp32" else 4.0
        parts["text encoder(s)"] = (m.text_encoder_params_b + m.image_encoder_params_b) * 1e9 * te_bpp / GiB
    if not s.cache_latents:
        parts["VAE + encoding"] = m.vae_params_b * 1e9 * 2 / GiB + m.vae_encode_gb * pixels * s.batch * frames
    lora = m.lora_params_per_rank_m * 1e6 * s.r * (1.2 if s.train_text_encoder else 1.0) * n_exp
    parts["LoRA weights, grads, optimizer"] = lora * (LORA_BYTES + OPTIMIZER_BYTES.get(s.optimizer, 8.0)) / GiB
    if m.kind == "dit" and m.hidden and m.attn_blocks:
        tokens = (s.image_tokens or m.image_tokens(res, frames)) + ((s.text_tokens or m.text_tokens) if m.joint_text else 0)
        per_block = s.batch * tokens * m.hidden * 2  # one bf16 tensor of hidden size, per block
        if s.gradient_checkpointing:
            act = per_block * m.attn_blocks + per_block * DIT_ACT_HIDDEN
        else:
            act = per_block * DIT_ACT_HIDDEN * m.attn_blocks
        parts["activations"] = act / GiB
    else:
        act = m.activations_gc_gb if s.gradient_checkpointing else m.activations_full_gb
        parts["activations"] = act * pixels * s.batch * frames
    return parts


def _llm_parts(m: LLMArch, s: Settings) -> dict[str, float]:
    fw = framework(s.framework)
    if s.base_dtype in ("nf4", "gptq"):
        # what is not quantised (embeddings, LM head, norms) stays 16-bit: lorapod's engine undoes peft's
        # fp32 upcast (engine/llm_model.keep_16bit), so the residual stream stays 2 bytes as well
        weights = (m.linear_params * BYTES_PER_PARAM[s.base_dtype] + (m.params - m.linear_params) * 2) / GiB
    else:
        weights = m.params * BYTES_PER_PARAM[s.base_dtype] / GiB
    lora = m.lora_params(s.r, s.targets)
    tokens = s.batch * s.seq_len
    act_bytes = 2 if s.base_dtype != "fp32" else 4
    per_layer = tokens * (LLM_ACT_HIDDEN * m.hidden + LLM_ACT_INTER * m.intermediate) * act_bytes
    if s.gradient_checkpointing:
        kept = 0 if fw.offloads_checkpoints else m.layers * tokens * m.hidden * act_bytes
        act = kept + per_layer
    else:
        act = m.layers * per_layer
    parts = {
        f"base weights ({s.base_dtype})": weights,
        "LoRA weights, grads, optimizer": lora * (LORA_BYTES + OPTIMIZER_BYTES.get(s.optimizer, 8.0)) / GiB,
        "activations": act / GiB,
        f"logits + loss ({fw.name})": tokens * s.label_fraction * m.vocab * fw.logit_bytes / GiB,
    }
    square = attention_square_bytes(m, s)
    if square:
        parts[f"attention (L x L, {s.attention})"] = square / GiB
    if s.base_dtype == "gptq":
        # AutoGPTQ's matmul keeps each layer's dequantised fp16 weights for its backward
        # (plan/work.py): one layer's with checkpointing (the one being recomputed), else all.
        layers = 1 if s.gradient_checkpointing else m.layers
        parts["dequantised weights kept for the backward"] = m.linear_params / m.layers * layers * 2 / GiB
    return parts


def attention_square_bytes(m: LLMArch, s: Settings) -> float:
    """Bytes that grow with the square of the sequence on ``s.attention`` (ATTN_PATHS)."""
    if s.attention not in ATTN_PATHS:
        raise ValueError(f"unknown attention path {s.attention!r}")
    if s.attention == "padding_free":
        return 0.0
    act_bytes = 2 if s.base_dtype != "fp32" else 4
    mask = s.batch * s.seq_len**2 * act_bytes
    if s.attention == "mask":
        return float(mask)
    layers = 1 if s.gradient_checkpointing else m.layers
    return float(mask + layers * s.batch * m.heads * s.seq_len**2 * EAGER_PROB_BYTES)


def check_fits(model: ImageModel, s: Settings, vram_gb: float, what: str = "this job") -> Estimate:
    """The estimate of a block-swapping DiT job (Wan), or HardwareError when it exceeds ``vram_gb``:
    even with every block but one swapped (the hint names the settings that help), or with the
    spec's ``blocks_to_swap`` (the hint names the count that fits). The same ``estimate`` and the same
    comparison as the planner's "does-not-fit" verdict, so the engine's pre-flight and ``lorapod plan``
    cannot disagree. Block swap needs gradient checkpointing (the engine turns it on), so swapped
    trials count with it."""
    n = model.blocks or 1
    most = n - 1

    def swapped(k: int) -> Settings:
        return replace(s, blocks_to_swap=k, gradient_checkpointing=s.gradient_checkpointing or k > 0)

    tokens = s.image_tokens or int(model.image_tokens(int(s.resolution), int(s.frames)))  # type: ignore[arg-type]
    floor = estimate(model, swapped(most)).peak_gb
    if floor > vram_gb:
        two = resident_experts(model, s) > 1
        raise HardwareError(
            f"{what} needs at least {floor:.1f} GB of GPU memory even with {most} of {n} blocks swapped to "
            f"CPU ({tokens} latent tokens per sample); this GPU has {vram_gb:.1f} GB",
            hint=("train.experts: high_noise or low_noise (one expert per run), " if two else "")
                 + "use fewer/shorter data.target_frames or a lower data.resolution"
                 + ("" if s.base_dtype == "fp8" else ", model.dtype: fp8 on an Ada/Hopper GPU")
                 + ", or a larger GPU (lorapod plan lists them)")
    need = estimate(model, swapped(s.blocks_to_swap))
    if need.peak_gb > vram_gb:
        k = next(k for k in range(s.blocks_to_swap, n) if estimate(model, swapped(k)).peak_gb <= vram_gb)
        raise HardwareError(f"{what} needs about {need.peak_gb:.1f} GB with train.blocks_to_swap: {s.blocks_to_swap}; "
                            f"this GPU has {vram_gb:.1f} GB",
                            hint=f"set train.blocks_to_swap: {k} (or more) and train.gradient_checkpointing: true")
    return need


#: GPU architectures with fp8 tensor cores (compute capability >= 8.9): what ``model.dtype: fp8``
#: needs (engine/device.py refuses it below). Names as catalog/data/gpus.yaml's ``arch``.
FP8_ARCHS = frozenset({"ada", "hopper", "blackwell"})


def arch_of(capability: tuple[int, int]) -> str:
    """The catalog's architecture name for a CUDA compute capability (NVIDIA's CUDA GPUs list):
    7.0 volta, 7.5 turing, 8.0/8.6/8.7 ampere, 8.9 ada, 9.0 hopper, 10.x/12.x blackwell."""
    major, minor = capability
    if major >= 10:
        return "blackwell"
    if major == 9:
        return "hopper"
    if (major, minor) >= (8, 9):
        return "ada"
    if major == 8:
        return "ampere"
    return "turing" if (major, minor) >= (7, 5) else "volta"


def model_kind(model: ImageModel | LLMArch) -> str:
    """"video" (a video VAE folds frames), "image" (other diffusion models) or "llm"."""
    if not isinstance(model, ImageModel):
        return "llm"
    return "video" if model.frames_per_latent else "image"


def suggestions(model: ImageModel | LLMArch, s: Settings, arch: str | None = None) -> list[tuple[Suggestion, Settings]]:
    """Single changes, cheapest first (by the time or quality they cost), each with its estimate.

    Only changes the job's trainer (``s.framework``) implements and the GPU can run: fp8 base
    weights on an fp8 architecture (``arch``; None: not known, as when planning for any GPU)."""
    fw = framework(s.framework)
    out: list[tuple[str, tuple[str, ...], str, Settings]] = []
    if s.optimizer == "adamw":
        out.append(("8-bit AdamW", ("train.optimizer=adamw_8bit",), "no time cost", replace(s, optimizer="adamw_8bit")))
    if isinstance(model, ImageModel) and not (s.cache_latents and s.cache_text_encoder_outputs):
        out.append((
            "cache latents and text-encoder outputs",
            ("data.cache_latents=true", "data.cache_text_encoder_outputs=true"),
            "disables caption shuffle/dropout",
            replace(s, cache_latents=True, cache_text_encoder_outputs=True),
        ))
    if not s.gradient_checkpointing:
        out.append(("gradient checkpointing", ("train.gradient_checkpointing=true",), "about 20% more time",
                    replace(s, gradient_checkpointing=True)))
    if s.batch > 1:
        out.append(("batch 1 with gradient accumulation", ("train.micro_batch_size=1", f"train.grad_accum={s.batch}"),
                    "slower per example", replace(s, batch=1)))
    if isinstance(model, ImageModel):
        if resident_experts(model, s) > 1:
            out.append(("one Wan2.2 expert per run", ("train.experts=low_noise",),
                        "a second run (train.experts=high_noise) trains the other", replace(s, experts="low_noise")))
        if s.base_dtype in ("bf16", "fp16", "fp32") and fw.fp8_base and (arch is None or arch in FP8_ARCHS):
            out.append(("fp8 base weights", ("model.dtype=fp8",), "slight quality cost", replace(s, base_dtype="fp8")))
    elif s.base_dtype != "nf4":
        out.append(("QLoRA (4-bit base)", ("method.type=qlora",), "about 30% more time, CUDA only",
                    replace(s, base_dtype="nf4")))
    if not isinstance(model, ImageModel) and s.seq_len > 512:
        out.append(("shorter sequences", (f"data.sequence_len={s.seq_len // 2}",), "long examples are cut",
                    replace(s, seq_len=s.seq_len // 2)))
    result = []
    for change, sets, cost, new in out:
        est = estimate(model, new)
        result.append((Suggestion(change, sets, est.peak_gb, cost, new), new))
    return result


def make_fit(model: ImageModel | LLMArch, s: Settings, vram_gb: float, arch: str | None = None) -> Suggestion | None:
    """The cheapest change (or stack of changes) that brings the peak under ``vram_gb``.

    Single changes are tried cheapest first; then they are stacked in that order; block swap
    (the slowest) comes last, with the fewest blocks that suffice, and only where the job's
    trainer implements it for this kind of model (:attr:`Framework.block_swap`). ``arch``: the
    GPU's architecture (catalog name, :func:`arch_of`); fp8 is suggested only where it runs.
    """
    singles = suggestions(model, s, arch)
    for sug, _ in singles:
        if sug.peak_gb <= vram_gb * (1 - TIGHT_FRACTION / 2):
            return sug
    chosen: list[tuple[Suggestion, Settings]] = []
    stacked = s
    for sug, new in singles:
        chosen.append((sug, new))
        stacked = _stack(s, [n for _, n in chosen])
        if estimate(model, stacked).peak_gb <= vram_gb * (1 - TIGHT_FRACTION / 2):
            # Drop changes the others make unnecessary, the costliest first.
            for item in list(reversed(chosen)):
                rest = [c for c in chosen if c is not item]
                if rest and estimate(model, _stack(s, [n for _, n in rest])).peak_gb <= vram_gb * (
                    1 - TIGHT_FRACTION / 2
                ):
                    chosen = rest
            stacked = _stack(s, [n for _, n in chosen])
            return Suggestion(
                " + ".join(c.change for c, _ in chosen),
                tuple(x for c, _ in chosen for x in c.sets),
                estimate(model, stacked).peak_gb,
                "combined",
                stacked,
            )
    changes = [c.change for c, _ in chosen]
    sets = [x for c, _ in chosen for x in c.sets]
    if isinstance(model, ImageModel) and model.blocks and framework(s.framework).swaps_blocks(
        model_kind(model), model.family
    ):
        for n in range(max(1, stacked.blocks_to_swap + 1), model.blocks):
            trial = replace(stacked, blocks_to_swap=n)
            peak = estimate(model, trial).peak_gb
            if peak <= vram_gb * (1 - TIGHT_FRACTION / 2):
                return Suggestion(
                    " + ".join([*changes, f"block swap {n}"]), (*sets, f"train.blocks_to_swap={n}"), peak,
                    "each swapped block costs time every step", trial,
                )
    return None


def _stack(base: Settings, news: list[Settings]) -> Settings:
    out = base
    for n in news:
        out = _merge(out, n)
    return out


def _merge(a: Settings, b: Settings) -> Settings:
    """Apply every field in which ``b`` differs from its origin onto ``a``: suggestions only tighten."""
    return replace(
        a,
        optimizer="adamw_8bit" if "8bit" in b.optimizer else a.optimizer,
        cache_latents=a.cache_latents or b.cache_latents,
        cache_text_encoder_outputs=a.cache_text_encoder_outputs or b.cache_text_encoder_outputs,
        gradient_checkpointing=a.gradient_checkpointing or b.gradient_checkpointing,
        batch=min(a.batch, b.batch),
        base_dtype=b.base_dtype if BYTES_PER_PARAM[b.base_dtype] < BYTES_PER_PARAM[a.base_dtype] else a.base_dtype,
        seq_len=min(a.seq_len, b.seq_len),
        experts=b.experts if b.experts != "both" else a.experts,
    )


CLIP_SUFFIXES = (".mp4", ".webm", ".mov", ".mkv", ".avi")


def _has_clips(spec: JobSpec) -> bool:
    """Whether a video family's data are clips (planned at the spec's window lengths) or stills
    (one frame each, as the engine trains them): ``data.format`` says so, or, with ``auto``, the
    data folder holds at least one clip. Without the folder (planning ahead), ``auto`` means clips."""
    if spec.data.format in ("video", "images"):
        return spec.data.format == "video"
    from pathlib import Path

    paths = [Path(p) for p in spec.data_paths()]
    if not any(p.exists() for p in paths):
        return True
    return any(f.suffix.lower() in CLIP_SUFFIXES for p in paths if p.is_dir() for f in p.rglob("*"))
