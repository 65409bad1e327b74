"""An unpacked LLM job is priced as the engine runs it (issue 48, F3): each micro-batch padded to
its longest row (engine/llm_data.py ``collate``), not ``micro_batch_size x data.sequence_len``."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LLM = ROOT / "examples" / "llm-chat-lora.yaml"


@pytest.fixture(autouse=True)
def _isolate(tmp_path, monkeypatch):
    monkeypatch.setenv("LORAPOD_HOME", str(tmp_path / "home"))


def _lengths(n: int, seed: int = 3) -> list[int]:
    rng = random.Random(seed)
    return [max(4, min(2048, int(rng.lognormvariate(4.5, 0.8)))) for _ in range(n)]


@pytest.mark.parametrize("micro_batch_size,multiple", [(1, 1), (4, 8), (8, 64)])
def test_padded_tokens_match_the_engines_own_batches(micro_batch_size, multiple):
    """The planner's replay against the engine's ``batch_rows`` + ``collate`` on the same lengths:
    the shuffles differ (Python's random vs torch's), the rule is the same, so the totals agree
    within a couple of percent, and both are far below micro_batch_size x sequence_len."""
    torch = pytest.importorskip("torch")
    from lorapod.chat.tokenize import Example
    from lorapod.engine import llm_data
    from lorapod.plan.padding import padded_tokens

    lengths = _lengths(1500)
    examples = [Example([1] * n, [1] * n) for n in lengths]
    rows = llm_data.unpacked(examples)
    engine_total = engine_batches = 0
    for epoch in range(3):
        g = torch.Generator().manual_seed(42 * 1000 + epoch)
        for group in llm_data.batch_rows(rows, micro_batch_size, g, group_by_length=True):
            engine_total += llm_data.collate(group, examples, 0, multiple).input_ids.numel()
            engine_batches += 1
    planned, batches = padded_tokens(lengths, micro_batch_size, 3, 42, multiple)
    assert batches == engine_batches
    assert planned == pytest.approx(engine_total, rel=0.02)
    assert planned < 0.2 * batches * micro_batch_size * 2048
    if micro_batch_size == 1 and multiple == 1:
        assert planned == engine_total == 3 * sum(lengths)  # one row per batch: no padding at all


def _spec(tmp_path: Path, packing: bool, data: Path | None):
    from lorapod.spec import load_spec

    sets = [f"data.packing={str(packing).lower()}", "compute.provider=vast"]
    if data is not None:
        sets.append(f"data.path={data}")
    else:
        sets.append(f"data.path={tmp_path / 'absent.jsonl'}")
    return load_spec(LLM, sets)


def _chats(tmp_path: Path) -> Path:
    rng = random.Random(1)
    lines = []
    for i in range(800):
        reply = " ".join(f"word{j}" for j in range(rng.randint(10, 120)))
        lines.append(json.dumps({"messages": [{"role": "user", "content": f"question {i}?"},
                                              {"role": "assistant", "content": reply}]}))
    path = tmp_path / "chats.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_unpacked_plan_costs_padded_rows_not_sequence_len(tmp_path):
    """Short chats, unpacked: the train phase is what the padded rows cost, about the packed
    job's, not ~sequence_len / mean length times more (the review's 2.9 h for ~29 min)."""
    from lorapod.plan.choose import plan_job
    from lorapod.plan.estimate import step_speed

    data = _chats(tmp_path)
    unpacked = plan_job(_spec(tmp_path, False, data), gpu="RTX 3090")
    packed = plan_job(_spec(tmp_path, True, data), gpu="RTX 3090")
    train = {n: next(p.hours for p in plan.best.phases if p.name == "train")
             for n, plan in (("unpacked", unpacked), ("packed", packed))}
    # the old figure (every micro-batch costed as sequence_len tokens) was ~10x the packed job's
    assert train["unpacked"] < 4 * train["packed"]
    job = unpacked.job
    # the step is priced at the padded row, replayed on the data's own lengths
    from lorapod.data.chat_split import load_split, trained_tokens
    from lorapod.plan.padding import padded_tokens

    split, _ = load_split(job.spec, log=lambda _m: None)
    lengths = [trained_tokens(c, job.spec.data.sequence_len) for c in split.train]
    t = job.spec.train
    total, batches = padded_tokens(lengths, t.micro_batch_size, t.epochs, t.seed)
    assert job.steps == batches
    assert job.step_settings.seq_len == round(total / (batches * t.micro_batch_size))
    assert job.step_settings.seq_len < job.spec.data.sequence_len / 10
    from lorapod.catalog.gpus import find_gpu

    sec = step_speed(job.model, job.step_settings, find_gpu("RTX 3090"), job.estimate, learn=False).seconds_per_step
    assert train["unpacked"] * 3600 == pytest.approx(sec * job.steps, rel=0.01)
    said = " ".join(unpacked.best.warnings)
    assert "padded to the longest" in said and "from the data's own lengths" in said


def test_unpacked_without_data_says_what_it_assumed(tmp_path):
    from lorapod.plan.choose import plan_job

    plan = plan_job(_spec(tmp_path, False, None), gpu="RTX 3090")
    said = " ".join(plan.best.warnings)
    assert "data.packing is off and the data is not here" in said
    assert plan.job.step_settings.seq_len < plan.job.spec.data.sequence_len
