"""The LLM figures the planner holds, counted on the code that runs them on torch's ``meta``
device (plan/step_count.py's counters): transformers' Llama decoder layer with peft's LoRA
(kernels per layer and per LoRA linear, the bytes its memory-bound operators move per token),
each eager trainer's loss (bytes per logit at its peak), and AutoGPTQ's unpacking of a GPTQ
layer (bytes and kernels per weight). plan/work.py and plan/frameworks.py hold the figures;
tests/test_plan_step_count.py re-counts them and ``bench/derive_architecture.py`` prints them. Needs
torch, peft and transformers: a development tool, never imported by ``lorapod plan``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from lorapod.plan.counted_models import bf16_on_meta
from lorapod.plan.step_count import (
    MATMULS,
    Traffic,
    count_forward,
    count_step,
    count_traffic,
    fused_attention,
)

# ----------------------------------------------------------------------------- the Llama layer

LLAMA_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _llama_layer(targets: tuple[str, ...], tokens: int, *, trained_input: bool = False,
                 **shape: int) -> Callable[[], torch.Tensor]:
    """transformers' Llama decoder layer on ``meta`` in bf16 (SDPA attention, the base frozen,
    peft's LoRA on ``targets``): its forward over ``tokens`` tokens; ``trained_input``: the
    input needs a gradient, as a middle layer's does in training."""
    from peft import LoraConfig, inject_adapter_in_model
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    config = LlamaConfig(num_hidden_layers=1, attn_implementation="sdpa", **shape)
    with bf16_on_meta():
        layer = LlamaDecoderLayer(config, 0).requires_grad_(False)
        if targets:
            layer = inject_adapter_in_model(LoraConfig(r=8, target_modules=list(targets)), layer)
        states = torch.empty(1, tokens, config.hidden_size, requires_grad=trained_input)
        rope = LlamaRotaryEmbedding(config)(states, torch.arange(tokens)[None])

    def forward() -> torch.Tensor:
        out = layer(states, attention_mask=None, position_embeddings=rope)
        return out[0] if isinstance(out, tuple) else out

    return forward


def llama_layer_kernels(targets: tuple[str, ...] = ()) -> int:
    """Operators one forward of a transformers Llama decoder layer dispatches (bf16, SDPA
    attention), with LoRA (peft) on ``targets``: the planner's kernels per LLM layer and per LoRA
    linear. The count does not depend on the layer's width or the tokens."""
    forward = _llama_layer(targets, 128, hidden_size=512, intermediate_size=1024, num_attention_heads=4,
                                   num_key_value_heads=4)
    return count_forward(forward).kernels


def llama_layer_traffic(hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int,
                        targets: tuple[str, ...] = (), tokens: int = 256) -> tuple[float, float]:
    """Bytes per token the memory-bound operators of a transformers Llama decoder layer move in
    one forward and in its backward (bf16, fused attention, the base frozen, LoRA from peft on
    ``targets``): everything but the matmuls (timed by their FLOPs) and attention (its own
    kernel). The planner's elementwise term (plan/work.py) holds these as coefficients."""
    forward = _llama_layer(targets, tokens, trained_input=True, hidden_size=hidden,
                                   intermediate_size=intermediate, num_attention_heads=heads,
                                   num_key_value_heads=kv_heads, head_dim=head_dim)
    moved = Traffic(skip=MATMULS)
    with fused_attention(), moved:
        out = forward()
        done = moved.bytes
        out.backward(torch.empty_like(out))
    return done / tokens, (moved.bytes - done) / tokens


# ----------------------------------------------------------------------------- LLM losses

def loss_bytes_per_logit(framework: str, tokens: int = 512, vocab: int = 4096) -> float:
    """Peak bytes per (token x vocabulary) element of the LM head's output and the loss, forward
    and backward, as each trainer's code builds them (bf16 model): the planner's ``logit_bytes``
    (plan/frameworks.py) for the trainers whose loss runs eagerly.

    - ``hf``: transformers < 4.46 (LlamaForCausalLM): the model upcasts its logits to float32,
      shifts them with a contiguous copy, then cross-entropy.
    - ``transformers-4.46``: bf16 logits returned; the loss upcasts them and shifts the labels.
    - ``qwen-remote-code``: Qwen (v1)'s model code shifts the bf16 logits; the Trainer's bf16
      autocast runs the cross-entropy's log-softmax in float32 (an explicit upcast stands in).
    - ``lorapod``: lorapod's engine, logits at the label positions only, upcast, per-token loss.
    """
    import torch.nn.functional as F

    with bf16_on_meta():
        head = torch.nn.Linear(64, vocab, bias=False).requires_grad_(False)
        hidden = torch.empty(1, tokens, 64, requires_grad=True)
        labels = torch.zeros(1, tokens, dtype=torch.long)

    def hf() -> torch.Tensor:
        logits = head(hidden).float()
        return F.cross_entropy(logits[:, :-1].contiguous().view(-1, vocab), labels[:, 1:].reshape(-1))

    def transformers_446() -> torch.Tensor:
        logits = head(hidden)  # kept by the model's output until the loss returns
        return F.cross_entropy(logits.float().view(-1, vocab), labels.view(-1))

    def qwen_remote_code() -> torch.Tensor:
        shifted = head(hidden)[:, :-1].contiguous()
        return F.cross_entropy(shifted.view(-1, vocab).float(), labels[:, 1:].reshape(-1))

    def lorapod() -> torch.Tensor:
        logits = head(hidden[0])  # every position a label here
        return F.cross_entropy(logits.float(), labels[0], reduction="none").sum()

    forward = {"hf": hf, "transformers-4.46": transformers_446, "qwen-remote-code": qwen_remote_code,
               "lorapod": lorapod}[framework]
    return count_step(head, forward).peak / (tokens * vocab)


# ----------------------------------------------------------------------------- GPTQ bases

GPTQ_GROUP = 128


def gptq_dequant(bits: int = 4, in_features: int = 4096, out_features: int = 4096) -> Traffic:
    """One dequantisation of a GPTQ linear layer, the operators AutoGPTQ's ``QuantLinear``
    (qlinear_cuda_old, the one transformers' GPTQ integration loads for training, with exllama
    disabled) runs for inputs of 128 tokens or more, before its fp16 matmul reads the result:

        zeros  = ((qzeros[:, :, None] >> shifts) as int8) & mask, + 1         (per group: small)
        weight = ((qweight[:, None, :] >> shifts) as int8) & mask              (per weight)
        weight = scales * (weight - zeros)                                      (fp16, per weight)

    Counted on ``meta`` (plan/step_count.py's Traffic); divide by the weights for bytes per
    weight. 8-bit GPTQ unpacks to int16."""
    per_word = 32 // bits
    unpacked = torch.int16 if bits == 8 else torch.int8
    mask = 2**bits - 1
    groups = in_features // GPTQ_GROUP
    with torch.device("meta"):
        qweight = torch.empty(in_features // per_word, out_features, dtype=torch.int32)
        qzeros = torch.empty(groups, out_features // per_word, dtype=torch.int32)
        scales = torch.empty(groups, out_features, dtype=torch.float16)
        shifts = torch.arange(0, 32, bits, dtype=torch.int32)[None]

    def dequantise() -> torch.Tensor:
        zeros = torch.bitwise_right_shift(qzeros[:, :, None].expand(-1, -1, per_word), shifts[None]).to(unpacked)
        torch.bitwise_and(zeros, mask, out=zeros)
        zeros = (zeros + 1).reshape(groups, 1, -1)
        weight = torch.bitwise_right_shift(qweight[:, None, :].expand(-1, per_word, -1), shifts[..., None]).to(unpacked)
        torch.bitwise_and(weight, mask, out=weight)
        return (scales[:, None, :] * (weight.reshape(groups, GPTQ_GROUP, -1) - zeros)).reshape(in_features, -1)

    return count_traffic(dequantise)
