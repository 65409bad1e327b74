"""A test-side model of how ComfyUI loads a LoRA file, to judge lorapod's files by their consumer.

Written here from the facts of ComfyUI's comfy/lora.py (``model_lora_keys_clip``,
``model_lora_keys_unet``, ``load_lora``), comfy/utils.py (``unet_to_diffusers``,
``flux_to_diffusers``) and comfy/weight_adapter/lora.py, not copied from them:

- a LoRA module is found only under a name in the key map; every other key is logged as
  "lora key not loaded" and dropped;
- CLIP text encoders: ``lora_te_text_model_encoder_layers_{b}_{c}`` (SD 1.5, clip_l),
  ``lora_te1_...`` (clip_l), ``lora_te2_...`` (SDXL clip_g), and the diffusers names
  ``text_encoder.text_model.encoder.layers.{b}.{c}`` / ``text_encoder_2...``; c is one of
  q/k/v/out_proj (``self_attn_q_proj``...) and ``mlp_fc1`` / ``mlp_fc2``;
- SD UNets: ``lora_unet_<diffusers weight path, dots as _>`` and ``unet.<path>`` with ``.to_``
  written ``.processor.to_`` and ``to_out.0`` as ``to_out`` (the old attention-processor names);
- Flux: ``lora_unet_<BFL state-dict key>`` for every weight, plus ``transformer.<diffusers path>``
  and ``lora_transformer_<diffusers path>`` mapped onto the BFL weight (a row slice of a fused
  qkv / linear1 weight);
- Wan: ComfyUI builds its own WanModel (comfy/ldm/wan/model.py, the original Wan2.1 layout:
  ``blocks.N.self_attn.q``, ``cross_attn.k_img``, ``ffn.0``, ``head.head``...) and maps
  ``lora_unet_<state-dict path, dots as _>`` onto every weight (the generic first loop of
  ``model_lora_keys_unet``); comfy/lora_convert.py ``convert_lora_wan_fun`` turns the Wan-Fun
  spelling ``lora_unet__blocks_`` into that. Diffusers' WanTransformer3DModel paths relate to the
  original ones by diffusers' scripts/convert_wan_to_diffusers.py ``TRANSFORMER_KEYS_RENAME_DICT``;
- weights: ``.lora_up/.lora_down.weight``, ``_lora.up/down.weight``, ``.lora_B/.lora_A.weight``,
  ``.lora.up/down.weight``; the patch is ``strength * (alpha / rank if .alpha else 1) * up @ down``.
"""

from __future__ import annotations

import torch

CLIP_MAP = {"mlp.fc1": "mlp_fc1", "mlp.fc2": "mlp_fc2", "self_attn.k_proj": "self_attn_k_proj",
            "self_attn.q_proj": "self_attn_q_proj", "self_attn.v_proj": "self_attn_v_proj",
            "self_attn.out_proj": "self_attn_out_proj"}
PAIRS = [(".lora_up.weight", ".lora_down.weight"), ("_lora.up.weight", "_lora.down.weight"),
         (".lora_B.weight", ".lora_A.weight"), (".lora.up.weight", ".lora.down.weight")]

# A target: (component, diffusers module path, first row, rows) -- rows None = the whole weight.
Target = tuple[str, str, int, "int | None"]


def clip_keys(te_module: torch.nn.Module, component: str, names: list[str]) -> dict[str, list[Target]]:
    """``names``: the kohya-style prefixes ComfyUI gives this encoder (e.g. ['lora_te', 'lora_te1'])."""
    out: dict[str, list[Target]] = {}
    layers = dict(te_module.named_modules())
    for b in range(64):
        for c, short in CLIP_MAP.items():
            for root in ("text_model.", ""):  # the module as this transformers version names it
                path = f"{root}encoder.layers.{b}.{c}"
                if path in layers:
                    for n in names:
                        out[f"{n}_text_model_encoder_layers_{b}_{short}"] = [(component, path, 0, None)]
                    out[f"{component}.text_model.encoder.layers.{b}.{c}"] = [(component, path, 0, None)]
    return out


def unet_keys(unet: torch.nn.Module) -> dict[str, list[Target]]:
    out: dict[str, list[Target]] = {}
    for path, mod in unet.named_modules():
        if not isinstance(mod, (torch.nn.Linear, torch.nn.Conv2d)):
            continue
        t: list[Target] = [("unet", path, 0, None)]
        out[f"lora_unet_{path.replace('.', '_')}"] = t
        for p in ("", "unet."):
            d = f"{p}{path.replace('.to_', '.processor.to_')}"
            out[d[:-2] if d.endswith(".to_out.0") else d] = t
    return out


def flux_weight_map(transformer: torch.nn.Module, flux2: bool) -> dict[str, tuple[str, int, int | None]]:
    """diffusers module -> (BFL module, first row, rows) as comfy.utils.flux_to_diffusers says."""
    cfg = transformer.config
    h = cfg.num_attention_heads * cfg.attention_head_dim
    m: dict[str, tuple[str, int, int | None]] = {}
    for i in range(cfg.num_layers):
        d, b = f"transformer_blocks.{i}", f"double_blocks.{i}"
        for j, (x, y) in enumerate([("to_q", "add_q_proj"), ("to_k", "add_k_proj"), ("to_v", "add_v_proj")]):
            m[f"{d}.attn.{x}"] = (f"{b}.img_attn.qkv", j * h, h)
            m[f"{d}.attn.{y}"] = (f"{b}.txt_attn.qkv", j * h, h)
        ones = {"attn.to_out.0": "img_attn.proj", "attn.to_add_out": "txt_attn.proj"}
        if flux2:
            ones |= {"ff.linear_in": "img_mlp.0", "ff.linear_out": "img_mlp.2", "ff_context.linear_in": "txt_mlp.0",
                     "ff_context.linear_out": "txt_mlp.2"}
        else:
            ones |= {"ff.net.0.proj": "img_mlp.0", "ff.net.2": "img_mlp.2", "ff_context.net.0.proj": "txt_mlp.0",
                     "ff_context.net.2": "txt_mlp.2", "norm1.linear": "img_mod.lin",
                     "norm1_context.linear": "txt_mod.lin"}
        for x, y in ones.items():
            m[f"{d}.{x}"] = (f"{b}.{y}", 0, None)
    for i in range(cfg.num_single_layers):
        d, b = f"single_transformer_blocks.{i}", f"single_blocks.{i}"
        if flux2:
            m[f"{d}.attn.to_qkv_mlp_proj"] = (f"{b}.linear1", 0, None)
            m[f"{d}.attn.to_out"] = (f"{b}.linear2", 0, None)
        else:
            for j, x in enumerate(["attn.to_q", "attn.to_k", "attn.to_v"]):
                m[f"{d}.{x}"] = (f"{b}.linear1", j * h, h)
            m[f"{d}.proj_mlp"] = (f"{b}.linear1", 3 * h, 4 * h)
            m[f"{d}.proj_out"] = (f"{b}.linear2", 0, None)
            m[f"{d}.norm.linear"] = (f"{b}.modulation.lin", 0, None)
    m["x_embedder"] = ("img_in", 0, None)
    m["context_embedder"] = ("txt_in", 0, None)
    m["proj_out"] = ("final_layer.linear", 0, None)
    return m


def flux_keys(transformer: torch.nn.Module, flux2: bool) -> dict[str, list[Target]]:
    """Flux key map: each LoRA name -> the diffusers row slices its patch lands on."""
    wm = flux_weight_map(transformer, flux2)
    out: dict[str, list[Target]] = {}
    for dpath, (bfl, row, rows) in wm.items():
        out.setdefault(f"lora_unet_{bfl.replace('.', '_')}", []).append(("transformer", dpath, row, rows))
        for name in (f"transformer.{dpath}", f"lora_transformer_{dpath.replace('.', '_')}"):
            out[name] = [("transformer", dpath, 0, None)]
    for targets in out.values():
        targets.sort(key=lambda t: t[2])
    return out


# diffusers' scripts/convert_wan_to_diffusers.py TRANSFORMER_KEYS_RENAME_DICT, read right to left
# (diffusers path part -> original Wan / ComfyUI WanModel path part), the Linear and Conv parts only.
WAN_FROM_DIFFUSERS = [("condition_embedder.time_embedder.linear_1", "time_embedding.0"),
                      ("condition_embedder.time_embedder.linear_2", "time_embedding.2"),
                      ("condition_embedder.text_embedder.linear_1", "text_embedding.0"),
                      ("condition_embedder.text_embedder.linear_2", "text_embedding.2"),
                      ("condition_embedder.time_proj", "time_projection.1"),
                      ("condition_embedder.image_embedder.ff.net.0.proj", "img_emb.proj.1"),
                      ("condition_embedder.image_embedder.ff.net.2", "img_emb.proj.3"),
                      ("proj_out", "head.head"), ("ffn.net.0.proj", "ffn.0"), ("ffn.net.2", "ffn.2"),
                      ("attn1.to_out.0", "self_attn.o"), ("attn2.to_out.0", "cross_attn.o"),
                      ("attn1.to_", "self_attn."), ("attn2.add_k_proj", "cross_attn.k_img"),
                      ("attn2.add_v_proj", "cross_attn.v_img"), ("attn2.to_", "cross_attn.")]


def wan_keys(transformer: torch.nn.Module) -> dict[str, list[Target]]:
    """Wan key map over a diffusers WanTransformer3DModel: ComfyUI's ``lora_unet_`` names of its WanModel."""
    out: dict[str, list[Target]] = {}
    for path, mod in transformer.named_modules():
        if not isinstance(mod, (torch.nn.Linear, torch.nn.Conv3d)):
            continue
        wan = path
        for d, o in WAN_FROM_DIFFUSERS:
            if d in wan:
                wan = wan.replace(d, o)
                break
        out[f"lora_unet_{wan.replace('.', '_')}"] = [("transformer", path, 0, None)]
    return out


def load(tensors: dict[str, torch.Tensor], key_map: dict[str, list[Target]], strength: float = 1.0
         ) -> tuple[dict[tuple[str, str], torch.Tensor], list[str]]:
    """Patches per (component, diffusers module) and the keys ComfyUI would drop."""
    loaded: set[str] = set()
    patches: dict[tuple[str, str], torch.Tensor] = {}
    for x, targets in key_map.items():
        for up_s, down_s in PAIRS:
            if f"{x}{up_s}" in tensors:
                up, down = tensors[f"{x}{up_s}"].float(), tensors[f"{x}{down_s}"].float()
                alpha = tensors.get(f"{x}.alpha")
                scale = float(alpha) / down.shape[0] if alpha is not None else 1.0
                delta = strength * scale * (up.flatten(1) @ down.flatten(1))  # 1x1 convs as matrices
                loaded |= {f"{x}{up_s}", f"{x}{down_s}"} | ({f"{x}.alpha"} if alpha is not None else set())
                for comp, path, start, rows in targets:
                    patches[(comp, path)] = delta if rows is None else delta[start:start + rows]
                break
    return patches, sorted(k for k in tensors if k not in loaded)


def apply(modules: dict[str, torch.nn.Module], patches: dict[tuple[str, str], torch.Tensor]) -> None:
    with torch.no_grad():
        for (comp, path), delta in patches.items():
            w = modules[comp].get_submodule(path).weight
            w += delta.reshape(w.shape).to(w.dtype)
