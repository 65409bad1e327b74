"""Out of GPU memory inside a step (the GPU review, G11; issue 33 item 3), and the loop's reads from the
device (G21): on a CPU, with torch.OutOfMemoryError raised where CUDA would raise it."""

from __future__ import annotations

import sys

import pytest
import torch
import yaml

from lorapod.engine import loop
from lorapod.engine.checkpoint import CheckpointManager
from lorapod.engine.device import Precision
from lorapod.engine.llm import LLMRecipe
from lorapod.engine.loop import LossOut, fit, out_of_memory
from lorapod.errors import OutOfMemory
from lorapod.rundir import RunDir
from lorapod.spec import load_spec

from .cli_helpers import run_cli
from .llm_fixtures import make_assets, spec_dict


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("oom"))


def test_out_of_memory_in_a_step_saves_and_says_what_to_change(assets, tmp_path, monkeypatch, capsys):
    """The 3rd step runs out of memory: step-2 is saved, the CLI prints one error line (no traceback)
    with the peak and the plan's estimate, a hint with a --set, and exits non-zero."""
    _root, model_dir, train, val = assets
    raw = spec_dict(model_dir, train, val, tmp_path / "runs", epochs=3)
    raw["save"]["every_steps"] = 100  # the only checkpoint is the one the out-of-memory error saves
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(yaml.safe_dump(raw), encoding="utf-8")
    calls = {"n": 0}
    real_loss = LLMRecipe.loss

    def loss(self, batch):
        calls["n"] += 1
        if calls["n"] == 5:  # grad_accum 2: the first micro-batch of step 3
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 23.6 GiB total)")
        return real_loss(self, batch)

    monkeypatch.setattr(LLMRecipe, "loss", loss)
    code, out, err = run_cli(["train", str(spec_file), "--device", "cpu", "--run-dir", str(tmp_path / "run")], capsys)
    assert code != 0 and code != 130
    assert "Traceback" not in err + out
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    assert "out of GPU memory in step 3" in errors[0] and "checkpoint step-2 saved" in errors[0]
    assert "the plan estimated" in errors[0]
    assert "--set " in err and f"lorapod train --resume {tmp_path / 'run'}" in err
    newest = CheckpointManager(tmp_path / "run" / "checkpoints").latest()
    assert newest is not None and newest.state.step == 2
    assert "out of GPU memory in step 3" in (tmp_path / "run" / "events.log").read_text()


def test_out_of_memory_before_any_step_saves_nothing(assets, tmp_path, monkeypatch):
    _root, model_dir, train, val = assets
    spec = load_spec(raw=spec_dict(model_dir, train, val, tmp_path / "runs"))
    run = RunDir.create(spec.output.dir, "t")
    run.write_spec(spec)

    def loss(self, batch):
        raise torch.OutOfMemoryError("CUDA out of memory.")

    monkeypatch.setattr(LLMRecipe, "loss", loss)
    from lorapod.engine.llm import train_llm

    with pytest.raises(OutOfMemory) as got:
        train_llm(spec, run, device="cpu", show_progress=False, log=lambda m: None)
    assert got.value.checkpoint is None and got.value.step == 0
    assert "nothing trained yet" in got.value.message and "start again with --set" in got.value.hint
    assert CheckpointManager(run.checkpoints).latest() is None


def test_out_of_memory_evaluating_the_base_model_is_the_same_clear_error(assets, tmp_path, monkeypatch):
    """eval.at_start runs before the loop's handler: its out-of-memory error was a raw traceback."""
    _root, model_dir, train, val = assets
    raw = spec_dict(model_dir, train, val, tmp_path / "runs")
    raw.setdefault("eval", {})["at_start"] = True
    spec = load_spec(raw=raw)
    run = RunDir.create(spec.output.dir, "t")
    run.write_spec(spec)

    def evaluate(self):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")

    monkeypatch.setattr(LLMRecipe, "evaluate", evaluate)
    from lorapod.engine.llm import train_llm

    with pytest.raises(OutOfMemory) as got:
        train_llm(spec, run, device="cpu", show_progress=False, log=lambda m: None)
    assert "evaluating the base model before training" in got.value.message
    assert got.value.checkpoint is None and "start again with --set" in got.value.hint
    assert "out of GPU memory evaluating the base model" in (run.root / "events.log").read_text()


def _qwen7b_without_checkpointing(tmp_path, sequence_len: int, micro_batch_size: int):
    """A Qwen2.5-7B LoRA spec (nothing loaded: the planner's figures) without gradient checkpointing."""
    return load_spec(raw={
        "model": {"id": "Qwen/Qwen2.5-7B", "family": "llm"},
        "data": {"path": str(tmp_path / "d.jsonl"), "sequence_len": sequence_len},
        "train": {"micro_batch_size": micro_batch_size, "gradient_checkpointing": False},
        "output": {"dir": str(tmp_path / "runs")},
    })


def test_the_hint_is_the_planners_cheapest_change_that_fits(tmp_path, monkeypatch):
    """Qwen2.5-7B, 4 x 4096 tokens without checkpointing, out of memory on a 24 GiB card: the measured
    peak, the plan's estimate (as max_memory_allocated reads it) and make_fit's --set line."""
    spec = _qwen7b_without_checkpointing(tmp_path, sequence_len=4096, micro_batch_size=4)
    monkeypatch.setattr(loop, "device_memory_gb", lambda device: 23.6)
    err = out_of_memory(spec, tmp_path / "run", torch.device("cuda", 0), 41, tmp_path / "run/checkpoints/step-41", 23.1)
    assert isinstance(err, OutOfMemory) and err.peak_gb == 23.1 and err.planned_gb > 23.6
    assert "out of GPU memory in step 42: this GPU's 23.6 GiB were not enough (peak 23.10 GiB allocated; " \
           f"the plan estimated {err.planned_gb:.2f} GiB); checkpoint step-41 saved" == err.message
    from lorapod.catalog.models import find_model
    from lorapod.plan.vram import Settings, estimate, make_fit

    model = find_model("Qwen/Qwen2.5-7B", "llm")
    settings = Settings.from_spec(spec, model)
    want = make_fit(model, settings, 0.9 * min(23.6, estimate(model, settings).peak_gb))
    assert want is not None and want.peak_gb < 0.9 * 23.6
    assert err.hint.startswith(f"cheapest change that fits: {want.describe()}")
    sets = " ".join(f"--set {s}" for s in want.sets)
    assert "train.micro_batch_size=1" in sets  # a new batch shape: the saved run cannot continue exactly
    assert err.hint.endswith(f"; start a new run with {sets} (step-41 keeps what was trained so far)")


def test_a_change_the_checkpoint_survives_is_offered_as_a_resume(tmp_path, monkeypatch):
    spec = _qwen7b_without_checkpointing(tmp_path, sequence_len=2048, micro_batch_size=1)
    monkeypatch.setattr(loop, "device_memory_gb", lambda device: 23.6)
    err = out_of_memory(spec, tmp_path / "run", torch.device("cuda", 0), 9, tmp_path / "run/checkpoints/step-9", 23.4)
    assert err.hint.endswith(f"; continue with: lorapod train --resume {tmp_path / 'run'} "
                             "--set train.gradient_checkpointing=true"), err.hint


class _Linear:
    """A recipe small enough to count what the loop reads from the device."""

    unit = "it/s"

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(4, generator=g))
        self.data = [torch.randn(3, 4, generator=g) for _ in range(8)]
        self.sums: list[torch.Tensor] = []

    def trainable_parameters(self):
        return [self.w]

    def epoch_batches(self, epoch):
        return self.data

    def batch_units(self, batch):
        return batch.shape[0]

    def loss(self, batch):
        out = ((batch @ self.w) ** 2).sum() * 1.37
        self.sums.append(out.detach().clone())
        return LossOut(loss_sum=out, units=batch.shape[0])

    def evaluate(self):
        return {}

    def train(self):
        return None

    def adapter_state(self):
        return {"w": self.w.detach().clone()}

    def load_adapter_state(self, state):
        self.w.data.copy_(state["w"])

    def save_final(self, out_dir):
        out_dir.mkdir(parents=True, exist_ok=True)

    def on_save(self, state, path):
        return None


def _fit_linear(assets, tmp_path):
    _root, model_dir, train, val = assets
    raw = spec_dict(model_dir, train, val, tmp_path / "runs", epochs=1, grad_accum=2)
    raw["eval"] = {"every_steps": None, "at_start": False}
    spec = load_spec(raw=raw)
    run = RunDir.create(spec.output.dir, "t")
    recipe = _Linear()
    result = fit(recipe, spec, run, Precision(torch.device("cpu"), "fp32", torch.float32), show_progress=False)
    return recipe, result


def test_the_loop_reads_the_device_once_per_optimizer_step(assets, tmp_path, monkeypatch):
    """Each read (float(), .item(), .tolist()) waits for the GPU to catch up; the loss of every
    micro-batch and the gradient norm used to be read one by one (grad_accum + 1 per step)."""
    reads = {"n": 0}
    for name in ("__float__", "item", "tolist"):
        real = getattr(torch.Tensor, name)

        def counted(self, *a, _real=real, **k):
            if sys._getframe(1).f_code.co_filename.endswith(("engine/loop.py", "engine/distributed.py")):
                reads["n"] += 1  # the loop's own reads (the optimizer reads its step count, on CPU only)
            return _real(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counted)
    _recipe, result = _fit_linear(assets, tmp_path)
    assert result.state.step == 4
    assert reads["n"] == result.state.step


def test_the_logged_losses_are_the_micro_batch_sums_as_before(assets, tmp_path):
    """Summing on the device in float64 gives, bit for bit, what summing each micro-batch's
    float() in Python gave."""
    recipe, result = _fit_linear(assets, tmp_path)
    sums = [float(s) for s in recipe.sums]
    expected = [(sums[i] + sums[i + 1]) / 6 for i in range(0, 8, 2)]
    assert result.losses == expected
