"""The LLM engine end to end on a tiny model: loss falls, resume is exact, the adapter reloads."""

from __future__ import annotations

import errno
import json

import pytest
import torch

from lorapod.engine.checkpoint import CheckpointManager
from lorapod.engine.llm import train_llm
from lorapod.engine.metrics import read_metrics
from lorapod.errors import CheckpointError, HardwareError
from lorapod.rundir import RunDir
from lorapod.spec import load_spec

from .llm_fixtures import make_assets, spec_dict


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("llm"))


def _run(assets, tmp_path, **train):
    _root, model_dir, tr, va = assets
    spec = load_spec(raw=spec_dict(model_dir, tr, va, tmp_path / "runs", **train))
    run = RunDir.create(spec.output.dir, "t")
    run.write_spec(spec)
    return spec, run


class Crash(Exception):
    pass


def test_training_lowers_val_loss_and_writes_run_folder(assets, tmp_path):
    spec, run = _run(assets, tmp_path, epochs=3)
    out = train_llm(spec, run, device="cpu", show_progress=False, log=lambda m: None)
    first, last = out.result.first_eval["val_loss"], out.result.last_eval["val_loss"]
    assert last < first - 0.5
    records = read_metrics(run.metrics_file)
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == list(range(1, out.result.state.step + 1))
    for key in ("lr", "tokens_per_s", "real_tokens_per_s", "grad_norm"):
        assert key in steps[0]
    assert steps[0]["real_tokens_per_s"] <= steps[0]["tokens_per_s"]
    assert any(r.get("event") == "eval" and r["step"] == 0 for r in records)
    assert (run.adapter / "adapter_config.json").is_file()
    assert (run.adapter / "adapter_model.safetensors").is_file()
    assert list(run.tensorboard.glob("events.out.tfevents.*"))
    assert "training" in run.events_file.read_text()
    assert (run.root / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_resume_reproduces_uninterrupted_losses(assets, tmp_path):
    """Interrupt after step 7 (last checkpoint at 6), resume: steps 7.. equal the straight run."""
    spec, run = _run(assets, tmp_path / "a", epochs=2)
    straight = train_llm(spec, run, device="cpu", show_progress=False, log=lambda m: None).result.losses

    spec2, run2 = _run(assets, tmp_path / "b", epochs=2)

    def crash(state, loss):
        if state.step == 7:
            raise Crash

    with pytest.raises(Crash):
        train_llm(spec2, run2, device="cpu", on_step=crash, show_progress=False, log=lambda m: None)
    assert CheckpointManager(run2.checkpoints).latest().state.step == 6
    resumed = train_llm(spec2, run2, resume=True, device="cpu", show_progress=False, log=lambda m: None)
    assert len(straight) > 8
    assert resumed.result.losses == pytest.approx(straight[6:], rel=1e-6, abs=1e-7)
    # metrics.jsonl has each step exactly once after the resume
    steps = [r["step"] for r in read_metrics(run2.metrics_file) if "loss" in r]
    assert steps == list(range(1, len(straight) + 1))


def test_saved_adapter_reloads_to_same_logits(assets, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    _root, model_dir, _tr, _va = assets
    spec, run = _run(assets, tmp_path, epochs=1)
    out = train_llm(spec, run, device="cpu", show_progress=False, log=lambda m: None)
    model = out.recipe.model.eval()
    ids = torch.tensor([out.recipe.train_examples[0].input_ids])
    with torch.no_grad():
        want = model(input_ids=ids).logits
        base = AutoModelForCausalLM.from_pretrained(str(model_dir))
        reloaded = PeftModel.from_pretrained(base, str(run.adapter)).eval()
        got = reloaded(input_ids=ids).logits
    assert torch.allclose(want, got, atol=1e-5)
    cfg = json.loads((run.adapter / "adapter_config.json").read_text())
    assert cfg["r"] == 8 and cfg["lora_alpha"] == 16


def test_disk_full_during_checkpoint_keeps_earlier_ones(assets, tmp_path, monkeypatch):
    spec, run = _run(assets, tmp_path, epochs=1)
    import lorapod.engine.checkpoint as ckpt

    real_save = ckpt.save_file
    calls = {"optimizer": 0}

    def flaky_save(tensors, filename, *a, **k):
        if str(filename).endswith("optimizer.safetensors"):
            calls["optimizer"] += 1
            if calls["optimizer"] == 2:  # the second checkpoint's optimizer file
                raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(tensors, filename, *a, **k)

    monkeypatch.setattr(ckpt, "save_file", flaky_save)
    with pytest.raises(CheckpointError, match="disk filled up"):
        train_llm(spec, run, device="cpu", show_progress=False, log=lambda m: None)
    mgr = CheckpointManager(run.checkpoints)
    names = [p.name for p in mgr.list()]
    assert names == ["step-3"]
    assert mgr.verify(mgr.list()[0])
    assert not [p for p in run.checkpoints.iterdir() if p.name.startswith(".tmp")]


def test_damaged_checkpoint_is_skipped(assets, tmp_path):
    spec, run = _run(assets, tmp_path, epochs=1)
    train_llm(spec, run, device="cpu", show_progress=False, log=lambda m: None)
    mgr = CheckpointManager(run.checkpoints)
    newest = mgr.list()[-1]
    (newest / "adapter.safetensors").write_bytes(b"torn")
    assert mgr.latest().path != newest
    with pytest.raises(CheckpointError, match="damaged"):
        mgr.load(newest)


def test_stop_file_saves_and_stops(assets, tmp_path):
    spec, run = _run(assets, tmp_path, epochs=2)

    def stop(state, loss):
        if state.step == 2:
            (run.root / "STOP").touch()

    out = train_llm(spec, run, device="cpu", on_step=stop, show_progress=False, log=lambda m: None)
    assert out.result.stopped == "stop_file"
    assert CheckpointManager(run.checkpoints).latest().state.step == 2


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_ctrl_c_whose_keyboardinterrupt_python_drops_still_saves_and_stops(assets, tmp_path):
    """Python drops (prints "Exception ignored") a KeyboardInterrupt raised while it runs a
    ``__del__``: the Ctrl-C that arrives then must still end the run at the next step, with a
    checkpoint, not leave it training (a CI run once trained on for minutes after its Ctrl-C)."""
    import signal

    from lorapod.engine.loop import Interrupted

    spec, run = _run(assets, tmp_path, epochs=2)

    class CtrlCWhileCollected:
        def __del__(self):
            signal.raise_signal(signal.SIGINT)  # the handler runs here, inside __del__

    def press(state, loss):
        if state.step == 2:
            CtrlCWhileCollected()  # collected at once; its KeyboardInterrupt goes nowhere

    # as at a terminal: pytest started as a shell's background job has SIGINT ignored, and lorapod leaves that alone
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(Interrupted) as got:
            train_llm(spec, run, device="cpu", on_step=press, show_progress=False, log=lambda m: None)
    finally:
        signal.signal(signal.SIGINT, old)
    assert got.value.how == "Ctrl-C" and got.value.step == 2
    assert CheckpointManager(run.checkpoints).latest().state.step == 2


def test_qlora_on_cpu_is_a_clear_error(assets, tmp_path):
    spec, run = _run(assets, tmp_path, epochs=1)
    spec.method.type = "qlora"
    with pytest.raises(HardwareError, match="CUDA"):
        train_llm(spec, run, device="cpu", show_progress=False, log=lambda m: None)


def test_adamw_8bit_on_cpu_is_a_clear_error(assets, tmp_path):
    spec, run = _run(assets, tmp_path, epochs=1, optimizer="adamw_8bit")
    with pytest.raises(HardwareError, match="CUDA"):
        train_llm(spec, run, device="cpu", show_progress=False, log=lambda m: None)


def test_unpacked_training_also_works(assets, tmp_path):
    spec, run = _run(assets, tmp_path, epochs=1, max_steps=3)
    spec.data.packing = False
    out = train_llm(spec, run, device="cpu", show_progress=False, log=lambda m: None)
    assert out.result.state.step == 3 and out.result.stopped == "max_steps"
    assert len(out.recipe.rows) == len(out.recipe.train_examples)


def test_the_adapter_init_depends_on_the_seed_alone(assets, tmp_path, monkeypatch):
    """Whatever loading consumes of the global RNG before the LoRA is attached (building a
    built-in model, a tokenizer, a cache miss) changes nothing: item 10's invariant, fast."""
    import lorapod.engine.llm as llm

    spec, run = _run(assets, tmp_path / "a", max_steps=3)
    plain = train_llm(spec, run, device="cpu", show_progress=False, log=lambda m: None).result.losses
    real = llm.load_tokenizer

    def busy_loader(spec):
        torch.rand(1000)  # what builtin.llm.build_base_model's manual_seed and init did to the RNG
        return real(spec)

    monkeypatch.setattr(llm, "load_tokenizer", busy_loader)
    spec, run = _run(assets, tmp_path / "b", max_steps=3)
    assert train_llm(spec, run, device="cpu", show_progress=False, log=lambda m: None).result.losses == plain


@pytest.mark.slow
def test_a_restart_from_step_0_reproduces_a_fresh_run_exactly(tmp_path):
    """Issue 22 item 10: the first run in a LORAPOD_HOME builds lorapod:tiny-llama, which reseeded
    the global RNG (builtin.llm.build_base_model) between the run's seed and the LoRA init; every later
    run (a restart after a kill before the first checkpoint included) found it built and started
    from other adapter weights: 0.7566 against 0.8089 after six epochs. Now both start alike."""
    from lorapod.builtin import llm
    from lorapod.home import lorapod_home

    train, val = llm.build_dataset()
    paths = []
    for name, rows in (("train", train[:16]), ("val", val[:4])):
        p = tmp_path / f"{name}.jsonl"
        p.write_text("".join(json.dumps(r) + "\n" for r in rows))
        paths.append(p)
    assert not (lorapod_home() / "models" / "tiny-llama").exists()  # this test's own LORAPOD_HOME
    losses = []
    for attempt in ("builds the model", "finds it built"):
        spec = load_spec(raw=spec_dict("lorapod:tiny-llama", *paths, tmp_path / attempt, max_steps=3))
        run = RunDir.create(spec.output.dir, "t")
        run.write_spec(spec)
        losses.append(train_llm(spec, run, device="cpu", show_progress=False, log=lambda m: None).result.losses)
    assert losses[0] == losses[1]
