"""Random weights in the real shapes, and tokenizers built here, for the real trainer runs.

    TRAINER_PYTHON tools/upstream/real_models.py sd15|sdxl|wan|zimage|qwenimage DEST HF_HOME

Runs under the trainer's own Python (its diffusers/transformers write the files its loader reads).
Nothing is downloaded: every model is built from its published configuration with random weights.

- SD 1.5 (``sd15``): a diffusers folder (what ``StableDiffusionPipeline.from_pretrained`` reads,
  sd-scripts library/train_util.py ``_load_target_model``): the U-Net from SD 1.5's own
  unet/config.json (860 M parameters; sd-scripts converts it into its fixed-size original U-Net,
  so nothing smaller loads), CLIP ViT-L/14's text model (12 layers, width 768, 123 M) and SD 1.5's
  VAE (83 M), all real shapes.
- SDXL (``sdxl``): the same with SDXL base's U-Net config (2.6 B; both U-Nets built on the meta device
  and written tensor by tensor with torch's default initialisation, so building SDXL peaks at one
  tensor, not at the model plus its serialised copy), CLIP ViT-L/14 and OpenCLIP
  bigG's text models. Stand-in, because two 2-core runs of the real 695 M bigG encoder plus a
  2.6 B U-Net do not fit the machine's memory with the rest: bigG keeps its width 1280 and
  projection 1280 (what the U-Net consumes) with 2 layers instead of 32 (sd-scripts reads the
  penultimate hidden state, so 2 is the fewest that has one).
- Wan2.1 T2V 1.3B (``wan``): the files musubi-tuner loads (wan_train_network.py, wan/modules):
  the DiT as a safetensors file of musubi's own ``WanModel`` with ``WAN_CONFIGS["t2v-1.3B"]``
  (1.4 B parameters; written tensor by tensor, in fp32 where the downloaded file is bf16: a CPU
  trains in fp32, and the file name lorapod downloads is kept), and the VAE as the ``.pth`` state
  dict of musubi's ``WanVAE_`` with Wan's configuration (127 M), both real shapes. The umT5-XXL
  text encoder (5.7 B parameters, 11 GB in bf16) is not built: tools/upstream/cpu_shims.py
  ``umt5_random`` answers musubi's ``T5EncoderModel`` with random outputs of its shape (one
  ``[tokens, 4096]`` bf16 tensor per caption), and musubi's own cache step writes them.
- Z-Image (``zimage``) and Qwen-Image (``qwenimage``), the files lorapod's musubi-tuner job downloads
  (ComfyUI's repackaged DiT, VAE and text encoder, trainers/musubi.py), built from musubi-tuner's own
  classes and configurations: each loader is called once with its weights file replaced by a
  recorder (:func:`built_by`), so the configuration is the one musubi builds, not a copy. Width is
  never changed; depth is (cpu_shims.py ``DEPTH``), because neither fits a 24 GB CPU machine in fp32 (Z-Image's
  6.2 B DiT is 24.6 GB, Qwen-Image's 20.4 B DiT 82 GB, their text encoders Qwen3-4B 16 GB and
  Qwen2.5-VL-7B 33 GB): the Z-Image DiT keeps 1 of its 30 main layers (and all 2 + 2 refiner
  layers), Qwen-Image's 1 of its 60 blocks, Qwen3-4B 2 of 36 layers, Qwen2.5-VL-7B 2 of 28 language
  layers and 1 of 32 vision blocks; the VAEs are whole. One shim sets these depths where musubi builds
  each model (cpu_shims.py ``depth``), for this builder and for the trainer's own processes alike, so
  the files and the models that load them cannot disagree.
  Files are written in the real files' dtypes (bf16, the VAE of Z-Image fp32; musubi runs Qwen-Image's
  bf16 VAE in its file's dtype, fast on a CPU only under cpu_shims.py ``bf16_cpu``) and key layouts where
  musubi reads one without converting it (the Qwen2.5-VL file in the ComfyUI layout, ``model.`` and
  ``visual.``, which musubi renames on load).
- The tokenizers: sd-scripts loads ``openai/clip-vit-large-patch14`` (and for SDXL
  ``laion/CLIP-ViT-bigG-14-laion2B-39B-b160k``) by hub id (library/strategy_sd.py, strategy_sdxl.py),
  and lorapod's job passes no ``--tokenizer_cache_dir``. So a CLIP BPE tokenizer (CLIPTokenizer's
  vocab.json/merges.txt format: the 256 byte symbols, each also with ``</w>``, the two special
  tokens, no merges, so every word is spelled out by its bytes) is put into a Hugging Face cache
  under that id, and the run uses it with ``HF_HUB_OFFLINE=1``: the trainer's own loader reads it
  exactly as it would read the downloaded one. Z-Image and Qwen-Image load a ``Qwen2Tokenizer`` from
  ``Tongyi-MAI/Z-Image`` / ``Qwen/Qwen-Image`` (subfolder ``tokenizer``): the same byte-level stand-in
  in Qwen's BPE files, plus merges that spell the words of the texts the runs encode (Qwen-Image's
  template, Z-Image's chat turn, the captions) whole, so they come out as about as many tokens as
  with Qwen's own merges (Qwen-Image drops its template's first 34), with Qwen's special tokens at
  their real ids (``<|endoftext|>`` 151643,
  ``<|im_start|>`` 151644, ``<|im_end|>`` 151645) and, for Z-Image's ``apply_chat_template``, a chat
  template that renders one user turn as Qwen3's does (``<|im_start|>user\n...<|im_end|>\n<|im_start|>assistant\n``).
  Other text falls back to one token per byte; the shapes the trainers handle are the real ones.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

QWEN_SPECIALS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645}
QWEN3_CHAT = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
              "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

# SD 1.5's unet/config.json (stable-diffusion-v1-5/stable-diffusion-v1-5), the fields that shape it
SD15_UNET = {"sample_size": 64, "in_channels": 4, "out_channels": 4, "layers_per_block": 2,
             "block_out_channels": [320, 640, 1280, 1280], "attention_head_dim": 8, "cross_attention_dim": 768,
             "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
             "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"],
             "norm_num_groups": 32, "act_fn": "silu", "center_input_sample": False, "downsample_padding": 1,
             "flip_sin_to_cos": True, "freq_shift": 0, "mid_block_scale_factor": 1, "norm_eps": 1e-05}
# SDXL base 1.0's unet/config.json (stabilityai/stable-diffusion-xl-base-1.0)
SDXL_UNET = {"sample_size": 128, "in_channels": 4, "out_channels": 4, "layers_per_block": 2,
             "block_out_channels": [320, 640, 1280], "attention_head_dim": [5, 10, 20], "cross_attention_dim": 2048,
             "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
             "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
             "transformer_layers_per_block": [1, 2, 10], "use_linear_projection": True,
             "addition_embed_type": "text_time", "addition_time_embed_dim": 256,
             "projection_class_embeddings_input_dim": 2816, "norm_num_groups": 32, "act_fn": "silu",
             "flip_sin_to_cos": True, "freq_shift": 0}
# SD 1.5's vae/config.json (SDXL's VAE has the same shape)
VAE = {"in_channels": 3, "out_channels": 3, "latent_channels": 4, "layers_per_block": 2,
       "block_out_channels": [128, 256, 512, 512], "sample_size": 512, "norm_num_groups": 32, "act_fn": "silu",
       "down_block_types": ["DownEncoderBlock2D"] * 4, "up_block_types": ["UpDecoderBlock2D"] * 4}
# openai/clip-vit-large-patch14 text_config
CLIP_L = {"vocab_size": 49408, "hidden_size": 768, "intermediate_size": 3072, "num_attention_heads": 12,
          "num_hidden_layers": 12, "max_position_embeddings": 77, "hidden_act": "quick_gelu", "projection_dim": 768}
# laion/CLIP-ViT-bigG-14-laion2B-39B-b160k text_config, 2 layers instead of 32 (see the docstring)
CLIP_G = {"vocab_size": 49408, "hidden_size": 1280, "intermediate_size": 5120, "num_attention_heads": 20,
          "num_hidden_layers": 2, "max_position_embeddings": 77, "hidden_act": "gelu", "projection_dim": 1280}
SCHEDULER = {"_class_name": "DDPMScheduler", "beta_start": 0.00085, "beta_end": 0.012, "beta_schedule": "scaled_linear",
             "num_train_timesteps": 1000, "clip_sample": False, "set_alpha_to_one": False, "steps_offset": 1}


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2/CLIP's byte -> printable character table (transformers' CLIPTokenizer uses the same)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


def clip_tokenizer(folder: Path) -> None:
    chars = list(bytes_to_unicode().values())
    vocab = {c: i for i, c in enumerate(chars)}
    vocab.update({c + "</w>": i + 256 for i, c in enumerate(chars)})
    vocab.update({"<|startoftext|>": 512, "<|endoftext|>": 513})
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "CLIPTokenizer", "model_max_length": 77, "bos_token": "<|startoftext|>",
        "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
        "do_lower_case": True}))
    (folder / "special_tokens_map.json").write_text(json.dumps({
        "bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>"}))


def hub_cache(hf_home: Path, repo_id: str, make) -> None:
    """Lay ``make(folder)``'s files out as huggingface_hub's cache holds a downloaded repo."""
    repo = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
    rev = "0" * 40
    make(repo / "snapshots" / rev)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(rev)


def text_model(cfg: dict, with_projection: bool):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    conf = CLIPTextConfig(**cfg, bos_token_id=512, eos_token_id=513, pad_token_id=513)
    return (CLIPTextModelWithProjection if with_projection else CLIPTextModel)(conf)


def sd_folder(dest: Path, family: str) -> None:
    import torch
    from diffusers import AutoencoderKL, UNet2DConditionModel

    torch.manual_seed(0)
    dest.mkdir(parents=True, exist_ok=True)
    # The U-Net on the meta device, its config saved as diffusers saves it and its weights written one
    # tensor at a time (write_safetensors): SDXL's 2.6 B parameters built and then serialised whole
    # (save_pretrained) peaked at 19.7 GB, the model plus safetensors' copy of it; this way the
    # peak is one tensor (issue 44). The U-Net and the text encoders in fp16, as the checkpoints users
    # download are (the fp16 variants of both repositories; SDXL's single-file sd_xl_base_1.0 is fp16):
    # half the disk (SDXL's U-Net 10.3 -> 5.1 GB); sd-scripts casts them to its weight dtype on load. The
    # VAE stays fp32, as both repositories' own VAE files are (SDXL's overflows in fp16).
    with torch.device("meta"):
        unet = UNet2DConditionModel(**(SD15_UNET if family == "sd15" else SDXL_UNET))
    unet.save_config(dest / "unet")
    write_safetensors(dest / "unet" / "diffusion_pytorch_model.safetensors",
                      [(n, tuple(t.shape), torch.float16, _cast(torch_default_init(n, tuple(t.shape)), torch.float16))
                       for n, t in unet.state_dict().items()])
    del unet
    AutoencoderKL(**VAE, scaling_factor=0.18215 if family == "sd15" else 0.13025).save_pretrained(dest / "vae")
    text_model(CLIP_L, False).half().save_pretrained(dest / "text_encoder")
    sched = dest / "scheduler"
    sched.mkdir(exist_ok=True)
    (sched / "scheduler_config.json").write_text(json.dumps(SCHEDULER))
    tok = ["transformers", "CLIPTokenizer"]
    if family == "sd15":
        index = {"_class_name": "StableDiffusionPipeline", "unet": ["diffusers", "UNet2DConditionModel"],
                 "vae": ["diffusers", "AutoencoderKL"], "text_encoder": ["transformers", "CLIPTextModel"],
                 "tokenizer": tok, "scheduler": ["diffusers", "DDPMScheduler"], "safety_checker": [None, None],
                 "feature_extractor": [None, None], "requires_safety_checker": False}
    else:
        text_model(CLIP_G, True).half().save_pretrained(dest / "text_encoder_2")
        index = {"_class_name": "StableDiffusionXLPipeline", "unet": ["diffusers", "UNet2DConditionModel"],
                 "vae": ["diffusers", "AutoencoderKL"], "text_encoder": ["transformers", "CLIPTextModel"],
                 "text_encoder_2": ["transformers", "CLIPTextModelWithProjection"], "tokenizer": tok,
                 "tokenizer_2": tok, "scheduler": ["diffusers", "DDPMScheduler"]}
    for sub in ("tokenizer", "tokenizer_2") if family == "sdxl" else ("tokenizer",):
        clip_tokenizer(dest / sub)
    (dest / "model_index.json").write_text(json.dumps(index))


def write_safetensors(path: Path, tensors) -> None:
    """The safetensors format (8-byte header length, JSON header, raw data), written one tensor at a
    time: a 1.4 B-parameter model never needs a second copy in memory."""
    import struct

    import torch

    names = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.int64: "I64"}
    items = list(tensors)  # (name, shape, dtype, make)
    header, offset = {}, 0
    for name, shape, dtype, _ in items:
        size = int(torch.tensor(shape).prod().item()) * dtype.itemsize if shape else dtype.itemsize
        header[name] = {"dtype": names[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for _name, _shape, _dtype, make in items:
            f.write(make().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())


def torch_default_init(name: str, shape: tuple[int, ...]):
    """What torch gives a freshly built layer, per tensor and without the layer: a Linear or Conv
    weight and bias uniform in +-1/sqrt(fan_in) (``reset_parameters``: kaiming_uniform_ with
    a=sqrt(5)), a norm's weight 1 and bias 0. Deterministic: the global generator, in file order."""
    def make():
        import torch

        if len(shape) >= 2:
            bound = 1.0 / max(1, int(torch.tensor(shape[1:]).prod().item())) ** 0.5
            return torch.empty(shape).uniform_(-bound, bound)
        if "norm" in name:
            return torch.ones(shape) if name.endswith("weight") else torch.zeros(shape)
        return torch.zeros(shape)
    return make


def wan_files(dest: Path) -> None:
    import torch
    from musubi_tuner.wan.configs import WAN_CONFIGS
    from musubi_tuner.wan.modules.model import WanModel
    from musubi_tuner.wan.modules.vae import WanVAE_

    torch.manual_seed(0)
    cfg = WAN_CONFIGS["t2v-1.3B"]
    with torch.device("meta"):
        model = WanModel(model_type="t2v", dim=cfg.dim, eps=cfg.eps, ffn_dim=cfg.ffn_dim, freq_dim=cfg.freq_dim,
                         in_dim=cfg.in_dim, num_heads=cfg.num_heads, num_layers=cfg.num_layers, out_dim=cfg.out_dim,
                         text_len=cfg.text_len)

    def init(name: str, shape: tuple[int, ...]):
        def make():
            if name.endswith("bias"):
                return torch.zeros(shape)
            if len(shape) == 1:  # norms and modulation vectors
                return torch.ones(shape)
            return torch.randn(shape) * 0.02
        return make

    # fp32, not the bf16 of the file it stands in for: musubi runs Wan's DiT in its file's dtype
    # (detect_wan_sd_dtype), and on a CPU the bf16 DiT fails in the time embedding, which musubi runs
    # under autocast(float32), a dtype CPU autocast does not take (it disables itself): fp32 input,
    # bf16 weight (measured 2026-12-05, with --mixed_precision no and bf16 alike)
    dit = dest / "split_files" / "diffusion_models" / "wan2.1_t2v_1.3B_bf16.safetensors"
    dit.parent.mkdir(parents=True, exist_ok=True)
    write_safetensors(dit, [(n, tuple(t.shape), torch.float32, init(n, tuple(t.shape)))
                            for n, t in model.state_dict().items()])
    vae = WanVAE_(dim=96, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[],
                  temperal_downsample=[False, True, True], dropout=0.0)
    torch.save(vae.state_dict(), dest / "Wan2.1_VAE.pth")
    # lorapod's job downloads it; the stand-in (cpu_shims umt5_random) never reads it
    (dest / "models_t5_umt5-xxl-enc-bf16.pth").write_bytes(b"")


# The text the real runs' Qwen tokenizers see: Qwen-Image's prompt template (qwen_image_utils.py
# get_qwen_prompt_embeds, whose first 34 tokens it drops), Z-Image's chat turn, and real_run.py's caption
QWEN_TEXTS = ("<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, "
              "spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n",
              "<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n", "zxq_mug, a mug on a table")


def word_merges(texts, pattern: str) -> list[tuple[str, str]]:
    """BPE merges that spell every pre-token of ``texts`` (split by the tokenizer's own ``pattern``) as
    one token, built left to right, so those words tokenize whole as with Qwen's real merges."""
    import regex

    byte_char = bytes_to_unicode()
    merges: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for text in texts:
        for part in text.split("<|"):  # the special tokens are matched whole before pre-tokenizing
            part = part.split("|>", 1)[-1]
            for piece in regex.findall(pattern, part):
                chars = [byte_char[b] for b in piece.encode("utf-8")]
                acc = chars[0] if chars else ""
                for c in chars[1:]:
                    if (acc, c) not in seen:
                        seen.add((acc, c))
                        merges.append((acc, c))
                    acc += c
    return merges


def qwen_tokenizer(folder: Path, chat_template: str | None = None) -> None:
    """A Qwen2Tokenizer (vocab.json + merges.txt): the 256 byte symbols, merges for the words the runs
    use (:func:`word_merges`), Qwen's specials at their ids."""
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    chars = list(bytes_to_unicode().values())
    merges = word_merges(QWEN_TEXTS, PRETOKENIZE_REGEX)
    vocab = {c: i for i, c in enumerate(chars)}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    cfg = {"tokenizer_class": "Qwen2Tokenizer", "model_max_length": 131072, "eos_token": "<|im_end|>",
           "pad_token": "<|endoftext|>", "unk_token": None, "bos_token": None, "errors": "replace",
           "added_tokens_decoder": {str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                                             "single_word": False, "special": True} for s, i in QWEN_SPECIALS.items()}}
    if chat_template:
        cfg["chat_template"] = chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))


class _Built(Exception):
    pass


def built_by(module, name: str, call) -> tuple[object, tuple, dict]:
    """What ``call()`` passes to ``module.name`` (a class or config the trainer's loader builds), the
    loader stopped right there, before it opens any weights file: (the real callable, args, kwargs)."""
    real = getattr(module, name)

    def record(*args, **kwargs):
        raise _Built(args, kwargs)

    setattr(module, name, record)
    try:
        call()
    except _Built as got:
        return real, got.args[0], got.args[1]
    finally:
        setattr(module, name, real)
    raise RuntimeError(f"{module.__name__}.{name} was not called")


def random_init(name: str, shape: tuple[int, ...]):
    """torch_default_init, with transformers' N(0, 0.02) for token embeddings and LM heads."""
    if len(shape) == 2 and ("embed_tokens" in name or "lm_head" in name):
        def make():
            import torch

            return torch.randn(shape) * 0.02
        return make
    if len(shape) == 1 and ("norm" in name or name.endswith(("gamma", "running_var"))) and not name.endswith("bias"):
        def ones():
            import torch

            return torch.ones(shape)
        return ones
    return torch_default_init(name, shape)


def write_module(path: Path, state: dict, dtype, rename=lambda k: k) -> None:
    """``state``'s tensors, random as a fresh module's, in ``dtype`` (integer buffers as they are:
    a BatchNorm's ``num_batches_tracked``, 0)."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    write_safetensors(path, [(rename(n), tuple(t.shape), torch.int64, lambda: torch.zeros((), dtype=torch.int64))
                             if t.dtype == torch.int64 else
                             (rename(n), tuple(t.shape), dtype, _cast(random_init(n, tuple(t.shape)), dtype))
                             for n, t in state.items()])


def _cast(make, dtype):
    return lambda: make().to(dtype)


def zimage_files(dest: Path, hf_home: Path) -> None:
    """trainers/musubi.py ZIMAGE_FILES under DEST, built by musubi-tuner's Z-Image code."""
    import torch
    from musubi_tuner.zimage import zimage_autoencoder, zimage_model, zimage_utils

    torch.manual_seed(0)
    dit = zimage_model.create_model("torch", False, torch.bfloat16)  # on meta (init_empty_weights)
    write_module(dest / "split_files/diffusion_models/z_image_bf16.safetensors", dit.state_dict(), torch.bfloat16)
    vae_cls, args, kwargs = built_by(zimage_autoencoder, "AutoencoderKL",
                                     lambda: zimage_autoencoder.load_autoencoder_kl("never-read"))
    with torch.device("meta"):
        vae = vae_cls(*args, **kwargs)
    write_module(dest / "split_files/vae/ae.safetensors", vae.state_dict(), torch.float32)
    cfg_cls, args, kwargs = built_by(zimage_utils, "Qwen3Config",
                                     lambda: zimage_utils.load_qwen3("never-read", dtype=None, device="cpu"))
    from transformers import Qwen3ForCausalLM

    with torch.device("meta"):
        te = Qwen3ForCausalLM(cfg_cls(*args, **kwargs))
    state = {k: v for k, v in te.state_dict().items() if k != "lm_head.weight"}  # tied: musubi copies embed_tokens
    write_module(dest / "split_files/text_encoders/qwen_3_4b.safetensors", state, torch.bfloat16)
    hub_cache(hf_home, zimage_utils.ZIMAGE_ID, lambda f: qwen_tokenizer(f / "tokenizer", QWEN3_CHAT))


def qwenimage_files(dest: Path, hf_home: Path) -> None:
    """trainers/musubi.py QWEN_IMAGE_FILES under DEST, built by musubi-tuner's Qwen-Image code."""
    import torch
    from musubi_tuner.qwen_image import qwen_image_model, qwen_image_utils

    torch.manual_seed(0)
    dit = qwen_image_model.create_model("torch", False, False, False, False, torch.bfloat16)
    write_module(dest / "split_files/diffusion_models/qwen_image_bf16.safetensors", dit.state_dict(), torch.bfloat16)
    vae_cls, args, kwargs = built_by(qwen_image_utils, "AutoencoderKLQwenImage",
                                     lambda: qwen_image_utils.load_vae("never-read"))
    with torch.device("meta"):
        vae = vae_cls(*args, **kwargs)
    write_module(dest / "split_files/vae/qwen_image_vae.safetensors", vae.state_dict(), torch.bfloat16)
    cfg_cls, args, kwargs = built_by(qwen_image_utils, "Qwen2_5_VLConfig",
                                     lambda: qwen_image_utils.load_qwen2_5_vl("never-read", None, "cpu"))
    from transformers import Qwen2_5_VLForConditionalGeneration

    with torch.device("meta"):
        te = Qwen2_5_VLForConditionalGeneration(cfg_cls(*args, **kwargs))

    def comfy_layout(key: str) -> str:  # what musubi's load_qwen2_5_vl renames back (model. / visual.)
        if key.startswith("model.language_model."):
            return "model." + key[len("model.language_model."):]
        if key.startswith("model.visual."):
            return "visual." + key[len("model.visual."):]
        return key

    write_module(dest / "split_files/text_encoders/qwen_2.5_vl_7b.safetensors", te.state_dict(), torch.bfloat16,
                 comfy_layout)
    hub_cache(hf_home, qwen_image_utils.QWEN_IMAGE_ID, lambda f: qwen_tokenizer(f / "tokenizer"))


def main() -> None:
    kind, dest, hf_home = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    hub_cache(hf_home, "openai/clip-vit-large-patch14", clip_tokenizer)
    if kind in ("sd15", "sdxl"):
        if kind == "sdxl":
            hub_cache(hf_home, "laion/CLIP-ViT-bigG-14-laion2B-39B-b160k", clip_tokenizer)
        sd_folder(dest, kind)
    elif kind == "wan":
        wan_files(dest)
    elif kind == "zimage":
        zimage_files(dest, hf_home)
    elif kind == "qwenimage":
        qwenimage_files(dest, hf_home)
    else:
        raise SystemExit(f"unknown model {kind}")
    (dest / ".built").write_text("ok\n")


if __name__ == "__main__":
    main()
