"""What the engine decides on a CUDA machine, checked on a CPU with the GPU mocked (the GPU review,
findings G6, G8, G10, G17, G19, G24): precision on a T4/V100, RNG states across GPU counts, QLoRA's
dtypes and checkpointing, TF32, and loading straight onto the GPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from lorapod.engine import device, llm_model
from lorapod.engine.checkpoint import capture_rng, load_state, restore_rng, save_state
from lorapod.engine.device import Precision, resolve_precision, set_tf32, tf32_flags
from lorapod.errors import HardwareError
from lorapod.spec import load_spec

from .llm_fixtures import make_model_dir, spec_dict, write_data

GiB = 1024**3


def fake_gpu(monkeypatch, major: int, minor: int = 0, gpus: int = 1) -> None:
    """torch.cuda as it answers on a machine with ``gpus`` GPUs of compute capability major.minor,
    where creating a bf16 tensor works (emulated below 8.0, as on a real T4)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda d=None: SimpleNamespace(major=major, minor=minor, total_memory=16 * GiB, name="fake"))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (major, minor))
    monkeypatch.setattr(torch.cuda, "_check_bf16_tensor_supported", lambda d: True)


CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def tf32_flags_restored():
    """resolve_precision turns TF32 on for a CUDA device: the global flags go back after each test."""
    before = tf32_flags()
    yield
    set_tf32(*before)


@pytest.mark.parametrize("capability", [(7, 5), (7, 0)])  # T4, V100: bf16 only emulated
def test_auto_precision_is_fp16_where_bf16_is_only_emulated(monkeypatch, capability):
    fake_gpu(monkeypatch, *capability)
    assert torch.cuda.is_bf16_supported()  # torch's default answer counts the emulation
    p = resolve_precision("auto", "auto", CUDA)
    assert (p.compute, p.weights, p.needs_grad_scaler) == ("fp16", torch.float16, True)
    with pytest.raises(HardwareError, match="bf16"):
        resolve_precision("bf16", "auto", CUDA)


def test_auto_precision_is_bf16_on_ampere_and_later(monkeypatch):
    fake_gpu(monkeypatch, 8, 0)
    p = resolve_precision("auto", "auto", CUDA)
    assert (p.compute, p.weights, p.needs_grad_scaler) == ("bf16", torch.bfloat16, False)


def test_a_cuda_engine_runs_fp32_matmuls_on_tf32(monkeypatch):
    fake_gpu(monkeypatch, 9, 0)
    set_tf32(False)  # PyTorch's default
    resolve_precision("fp32", "auto", CUDA)
    assert tf32_flags() == (True, True)
    if device.new_tf32_api():  # torch >= 2.9: the new API, and no legacy flag was touched
        assert torch.backends.cuda.matmul.fp32_precision == "tf32"
        assert torch.backends.cudnn.conv.fp32_precision == "tf32"


def test_cpu_leaves_tf32_alone():
    set_tf32(False)
    resolve_precision("auto", "auto", torch.device("cpu"))
    assert tf32_flags() == (False, False)


class Torch28cuBLAS:
    """``torch.backends.cuda.matmul`` as torch 2.7 and 2.8 have it (``cuBLASModule``,
    ``torch/backends/cuda/__init__.py@2.8.0:140-149``, the same in 2.7.0): four known flags,
    and ``AttributeError("Unknown attribute " + name)`` for anything else, read or written."""

    KNOWN = ("allow_tf32", "allow_fp16_reduced_precision_reduction", "allow_bf16_reduced_precision_reduction",
             "allow_fp16_accumulation")

    def __init__(self) -> None:
        object.__setattr__(self, "flags", dict.fromkeys(self.KNOWN, False))

    def __getattr__(self, name):
        if name in self.KNOWN:
            return self.flags[name]
        raise AttributeError("Unknown attribute " + name)

    def __setattr__(self, name, value):
        if name in self.KNOWN:
            self.flags[name] = value
            return
        raise AttributeError("Unknown attribute " + name)


class Torch28cuDNN:
    """``torch.backends.cudnn`` of torch 2.8: ``allow_tf32`` and no ``conv`` sub-module
    (``torch/backends/cudnn/__init__.py@2.8.0``: ``CudnnModule`` has ``enabled``, ``deterministic``,
    ``benchmark``, ``allow_tf32``...)."""

    def __init__(self) -> None:
        self.allow_tf32 = False


def test_tf32_on_a_torch_without_the_fp32_precision_api(monkeypatch):
    """Review N1: on RunPod's default image (torch 2.8) every CUDA job crashed in resolve_precision
    because ``fp32_precision`` does not exist there. With torch 2.8's modules, the legacy flags are set."""
    matmul, cudnn = Torch28cuBLAS(), Torch28cuDNN()
    monkeypatch.setattr(torch.backends.cuda, "matmul", matmul)
    monkeypatch.setattr(torch.backends, "cudnn", cudnn)
    fake_gpu(monkeypatch, 9, 0)
    p = resolve_precision("auto", "auto", CUDA)
    assert p.compute == "bf16"
    assert matmul.allow_tf32 is True and cudnn.allow_tf32 is True
    assert tf32_flags() == (True, True)


def _one_gpu_rng(monkeypatch, gpus_seen_when_saved: int = 8):
    """A 1-GPU machine whose torch.cuda refuses a state for a GPU it does not have, as
    ``torch.cuda.set_rng_state(state, i)`` does (IndexError into default_generators)."""
    fake_gpu(monkeypatch, 9, 0, gpus=1)
    restored: list[torch.Tensor] = []

    def set_rng_state(state, device="cuda"):
        index = device if isinstance(device, int) else (torch.device(device).index or 0)
        if index >= 1:
            raise IndexError("list index out of range")
        restored.append(state)

    monkeypatch.setattr(torch.cuda, "set_rng_state", set_rng_state)
    monkeypatch.setattr(torch.cuda.random, "set_rng_state", set_rng_state)
    states = [torch.full((8,), i, dtype=torch.uint8) for i in range(gpus_seen_when_saved)]
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": states[0].clone())
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [s.clone() for s in states])
    return states, restored


def test_a_checkpoint_from_an_8_gpu_node_resumes_on_one_gpu(monkeypatch):
    """An older checkpoint holds one CUDA state per GPU torchrun showed the process (8): a 1-GPU
    machine restores its own device's, not an IndexError."""
    states, restored = _one_gpu_rng(monkeypatch)
    saved = {**capture_rng(), "cuda": [s.clone() for s in states]}
    restore_rng(saved)
    assert len(restored) == 1 and torch.equal(restored[0], states[0])


def test_a_checkpoint_keeps_only_this_process_gpu_state(monkeypatch, tmp_path):
    states, restored = _one_gpu_rng(monkeypatch)
    rng = capture_rng()
    assert isinstance(rng["cuda"], torch.Tensor) and torch.equal(rng["cuda"], states[0])
    save_state(tmp_path, "rng", rng)  # through the checkpoint's own files, no pickle
    restore_rng(load_state(tmp_path, "rng"))
    assert len(restored) == 1 and torch.equal(restored[0], states[0])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    model_dir = make_model_dir(root)
    train, val = write_data(root)
    return model_dir, train, val, root


def _spec(tiny, **method):
    model_dir, train, val, root = tiny
    raw = spec_dict(model_dir, train, val, root / "runs", gradient_checkpointing=True)
    raw["method"].update(method)
    return load_spec(raw=raw)


def _bf16_model(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.bfloat16)


def test_qlora_keeps_embeddings_head_and_norms_in_16_bits(tiny):
    """peft's prepare_model_for_kbit_training upcasts everything bitsandbytes does not quantise to
    fp32 (+2 GiB for Qwen2.5-7B over the plan, and an fp32 residual stream); the engine casts them
    back, so the planner's 2 bytes per non-linear parameter hold. The 4-bit linears need CUDA: the
    casting is checked on a plain bf16 model standing in for the 4-bit one."""
    model = _bf16_model(tiny[0])
    model.is_loaded_in_4bit = True  # what transformers sets on a bitsandbytes model
    peft_model = llm_model.add_lora(model, _spec(tiny, type="qlora"), torch.bfloat16)
    base = peft_model.get_base_model()
    assert base.get_input_embeddings().weight.dtype == torch.bfloat16
    assert base.get_output_embeddings().weight.dtype == torch.bfloat16
    frozen = {p.dtype for p in peft_model.parameters() if not p.requires_grad}
    assert frozen == {torch.bfloat16}
    assert {p.dtype for p in peft_model.parameters() if p.requires_grad} == {torch.float32}  # LoRA stays fp32


def test_qlora_checkpointing_is_non_reentrant(tiny):
    """peft passes ``{}`` to transformers, which then skips its use_reentrant=False default: torch's
    legacy reentrant checkpointing (a warning each run, DDP restrictions). The engine asks for the
    non-reentrant one, as on its LoRA path."""
    model = _bf16_model(tiny[0])
    model.is_loaded_in_4bit = True
    peft_model = llm_model.add_lora(model, _spec(tiny, type="qlora"), torch.bfloat16)
    layer = peft_model.get_base_model().model.layers[0]
    assert layer.gradient_checkpointing
    assert layer._gradient_checkpointing_func.keywords.get("use_reentrant") is False


def test_keep_16bit_leaves_an_fp32_model_alone(tiny):
    model = _bf16_model(tiny[0]).float()
    llm_model.keep_16bit(model, torch.float32)
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_a_lora_base_loads_straight_onto_the_gpu(tiny, monkeypatch):
    """Single-device LoRA: ``device_map`` puts the weights on the GPU as they load, instead of
    the whole model in CPU RAM first and ``.to(cuda)`` after."""
    from transformers import AutoModelForCausalLM

    fake_gpu(monkeypatch, 9, 0)
    seen: dict = {}
    moved: list = []

    class Loaded:
        config = SimpleNamespace(use_cache=True)

        def to(self, where):
            moved.append(where)
            return self

        def set_attn_implementation(self, name):  # PreTrainedModel's: engine/attention.install calls it
            self.config._attn_implementation = name

    def from_pretrained(name, **kwargs):
        seen.update(kwargs)
        return Loaded()

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", from_pretrained)
    spec = _spec(tiny)
    llm_model.load_model(spec, Precision(torch.device("cuda", 0), "bf16", torch.bfloat16))
    assert seen["device_map"] == {"": 0} and moved == []
    seen.clear()
    llm_model.load_model(spec, Precision(torch.device("cpu"), "fp32", torch.float32))  # CPU (and FSDP staging)
    assert "device_map" not in seen and moved == [torch.device("cpu")]
