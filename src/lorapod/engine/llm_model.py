"""Loading an LLM and its tokenizer, and wrapping it in a LoRA/QLoRA adapter with peft.

Loading works from a hub id (cache first, then the hub) or a local folder. Failures become a
ModelLoadError that says how to get the model onto this machine, instead of a 40-line
``OSError`` from huggingface_hub.
"""

from __future__ import annotations

from pathlib import Path

import torch

from lorapod import builtin
from lorapod.catalog.models import hub_id, is_builtin
from lorapod.engine import attention
from lorapod.engine.device import Precision
from lorapod.errors import HardwareError, ModelLoadError, SpecError, require
from lorapod.home import hub_unreachable
from lorapod.spec import JobSpec
from lorapod.tokenizer import load_tokenizer as _load_tokenizer
from lorapod.tokenizer import offline as _offline


def _value_error(model_id: str, exc: ValueError, requested: str) -> Exception:
    """A ValueError from ``from_pretrained``: the files were found but transformers refused them
    (an attention implementation the class lacks, a bad config). Not a cache problem (review G7)."""
    text = str(exc).split("\n")[0]
    if "attention" in text.lower() or "attn_implementation" in text:
        return SpecError(f"cannot load '{model_id}' with train.attention {requested}: {text}",
                         hint="leave train.attention at auto: lorapod picks what the model supports")
    return ModelLoadError(f"cannot load '{model_id}': {text}",
                          hint="check model.id and model.revision; the files were found but transformers refused them")


def _load_error(model_id: str, exc: Exception) -> ModelLoadError:
    if Path(model_id).expanduser().exists():
        return ModelLoadError(
            f"'{model_id}' is a folder but not a loadable transformers model ({type(exc).__name__}: {exc})",
            hint="it needs config.json, the weights (*.safetensors) and the tokenizer files",
        )
    if model_id.startswith((".", "/", "~")):
        return ModelLoadError(f"model folder '{model_id}' does not exist", hint="check model.id in the spec")
    return ModelLoadError(
        f"cannot load '{model_id}': it is not in the local Hugging Face cache and the hub cannot be reached "
        f"({type(exc).__name__})",
        hint=(
            f"on a machine with internet run `huggingface-cli download {model_id}` (set HF_TOKEN for gated "
            "models), then copy the cache or the folder here and point model.id at it"
        ),
    )


def resolve_model_id(model_id: str) -> str:
    """What ``from_pretrained`` is given for ``model_id``: a built-in ``lorapod:`` id's folder
    (``lorapod.builtin``, built once), a catalog alias's hub id (``qwen2.5-0.5b`` ->
    ``Qwen/Qwen2.5-0.5B``), anything else (a hub id, a folder) as it is; as ``lorapod.tokenizer``
    resolves the same id for the tokenizer."""
    if is_builtin(model_id):
        return builtin.resolve(model_id)
    if "/" not in model_id and not Path(model_id).expanduser().exists():
        return hub_id(model_id) or model_id  # a catalog alias loads its hub id
    return model_id


def load_tokenizer(spec: JobSpec):
    """The spec's tokenizer, through the loader ``data check`` uses too (``lorapod.tokenizer``)."""
    m = spec.model
    return _load_tokenizer(m.id, m.revision, m.trust_remote_code)


def load_model(spec: JobSpec, precision: Precision, train_device: torch.device | None = None, *,
               empty: bool = False):
    """The base model, on ``precision.device``, with the attention path of ``train.attention``
    installed (engine/attention.py); the path is ``model.lorapod_attention``. ``train_device`` is
    where it will train when that is not where it loads (FSDP2 stages the base on the CPU): the
    attention path is chosen for it.

    ``empty`` builds the same model from its ``config.json`` alone on the ``meta`` device: no weight
    file is read and no memory is allocated. FSDP2's processes other than rank 0 start so, and
    rank 0 broadcasts its weights into their shards (engine/fsdp.py): host RAM for one base,
    not one per process (review G14)."""
    train_device = train_device or precision.device

    m = spec.model
    kwargs: dict = {
        "revision": m.revision,
        "trust_remote_code": m.trust_remote_code,
        "local_files_only": _offline() or bool(hub_unreachable()),
        "dtype": precision.weights,
        "attn_implementation": attention.load_name(spec.train.attention),
    }
    attention.check_device(spec.train.attention, train_device)
    if spec.method.type == "qlora":
        if precision.device.type != "cuda":
            raise HardwareError(
                "QLoRA loads the base model in 4 bits with bitsandbytes, which runs on CUDA GPUs only",
                hint="set method.type: lora to train on this machine, or run the job on a GPU (`lorapod run`)",
            )
        require("bitsandbytes", "cuda", "QLoRA")
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=precision.autocast_dtype if precision.compute != "fp32" else torch.bfloat16,
        )
    if empty:
        model = _empty_model(spec, kwargs)
    else:
        model = _load_weights(spec, precision, kwargs)
    model.config.use_cache = False
    path = attention.choose(spec.train.attention, type(model), train_device)
    attention.install(model, path)
    model.lorapod_attention = path
    return model


def _empty_model(spec: JobSpec, kwargs: dict):
    """The architecture of ``spec.model`` with its parameters and buffers on ``meta``: transformers'
    ``from_config`` (the dtype and attention implementation ``from_pretrained`` would apply; tied
    embeddings tied by ``post_init`` as there) inside torch's ``meta`` device context."""
    from transformers import AutoConfig, AutoModelForCausalLM

    m = spec.model
    try:
        config = AutoConfig.from_pretrained(resolve_model_id(m.id), revision=kwargs["revision"],
                                            trust_remote_code=kwargs["trust_remote_code"],
                                            local_files_only=kwargs["local_files_only"])
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, dtype=kwargs["dtype"],
                                                    attn_implementation=kwargs["attn_implementation"],
                                                    trust_remote_code=kwargs["trust_remote_code"])
    except OSError as exc:
        raise _load_error(m.id, exc) from exc
    except ValueError as exc:
        raise _value_error(m.id, exc, spec.train.attention) from exc


def _load_weights(spec: JobSpec, precision: Precision, kwargs: dict):
    """``from_pretrained``: the base with its weights, on ``precision.device``."""
    from transformers import AutoModelForCausalLM

    m = spec.model
    if precision.device.type == "cuda":
        # straight onto the GPU: not first into CPU RAM (host memory the size of the model, and a
        # slower start), as the 4-bit base must be anyway
        kwargs["device_map"] = device_map(precision.device)
    try:
        model = AutoModelForCausalLM.from_pretrained(resolve_model_id(m.id), **kwargs)
    except OSError as exc:
        raise _load_error(m.id, exc) from exc
    except ValueError as exc:
        raise _value_error(m.id, exc, spec.train.attention) from exc
    if "device_map" not in kwargs:
        model.to(precision.device)
    return model


def device_map(device: torch.device) -> dict[str, int]:
    """``from_pretrained``'s placement of the whole model on one GPU: this process's (torchrun's
    LOCAL_RANK, set as the current device by engine/distributed.py) when ``device`` names none."""
    return {"": device.index if device.index is not None else torch.cuda.current_device()}


def keep_16bit(model, dtype: torch.dtype) -> None:
    """Undo peft's fp32 upcast of the parameters QLoRA does not quantise (embeddings, LM head, norms).

    ``prepare_model_for_kbit_training`` casts every 16-bit parameter to fp32. For Qwen2.5-7B that is
    +2 GiB of embeddings and head over the plan, and an fp32 embedding (or norm) makes the whole
    residual stream fp32 (``Linear4bit`` returns its input's dtype): twice the activations the planner
    counts. The LoRA path keeps them in the compute dtype, RMSNorm computing in fp32 inside, and so does
    QLoRA now: the planner's 2 bytes for everything but the 4-bit linears hold for both."""
    if dtype not in (torch.bfloat16, torch.float16):
        return
    for param in model.parameters():
        if param.dtype == torch.float32 and not param.requires_grad and type(param).__name__ != "Params4bit":
            param.data = param.data.to(dtype)


def add_lora(model, spec: JobSpec, dtype: torch.dtype = torch.bfloat16):
    """Freeze the base and attach a LoRA adapter as the spec's ``method`` section says."""
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    meth = spec.method
    if meth.type == "qlora":
        # non-reentrant checkpointing, as the LoRA path: peft passes {} on, which skips transformers'
        # own default and leaves torch on the legacy reentrant path (a warning every run, DDP limits)
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=spec.train.gradient_checkpointing,
                                                gradient_checkpointing_kwargs={"use_reentrant": False})
        keep_16bit(model, dtype)
    elif spec.train.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    config = LoraConfig(
        r=meth.r,
        lora_alpha=meth.alpha,
        lora_dropout=meth.dropout,
        target_modules=meth.target_modules,
        use_rslora=meth.rslora,
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        peft_model = get_peft_model(model, config)
    except ValueError as exc:
        raise ModelLoadError(
            f"LoRA could not be attached: {exc}",
            hint="method.target_modules must name linear layers of this model, or be 'all-linear'",
        ) from exc
    return peft_model


def count_parameters(model) -> tuple[int, int]:
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return trainable, total
