"""Packing must not let examples see each other: packed per-example losses == one-by-one losses."""

from __future__ import annotations

import pytest
import torch

from lorapod.engine import llm_data
from lorapod.engine.llm import prepare
from lorapod.spec import load_spec

from .llm_fixtures import make_model_dir, spec_dict, write_data


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    root = tmp_path_factory.mktemp("pack")
    model_dir = make_model_dir(root)
    train, val = write_data(root)
    spec = load_spec(raw=spec_dict(model_dir, train, val, root / "runs"))
    recipe, _stats, _fb = prepare(spec, device="cpu")
    with torch.no_grad():  # make LoRA non-zero so the adapter path is exercised too
        for name, p in recipe.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    recipe.model.eval()
    return recipe


def _per_example_losses(recipe, rows):
    out = {}
    for row in rows:
        batch = llm_data.collate([row], recipe.train_examples, recipe.pad_id)
        with torch.no_grad():
            nll, where = recipe.token_losses(batch)
        seg = batch.segment_ids[0, 1:][where[:, 1]]
        for s, idx in enumerate(row.examples):
            out[idx] = nll[seg == s].sum().item()
    return out


def test_packed_rows_hold_several_examples(recipe):
    assert any(len(r.examples) >= 3 for r in recipe.rows)
    assert all(r.length <= recipe.spec.data.sequence_len for r in recipe.rows)
    packed_ids = sorted(i for r in recipe.rows for i in r.examples)
    assert packed_ids == list(range(len(recipe.train_examples)))


def test_packed_loss_equals_one_by_one(recipe):
    packed = _per_example_losses(recipe, recipe.rows[:6])
    alone = _per_example_losses(recipe, [llm_data.Row([i], len(recipe.train_examples[i])) for i in packed])
    assert set(packed) == set(alone)
    for i in packed:
        assert packed[i] == pytest.approx(alone[i], rel=1e-4, abs=1e-4), i


def test_mask_blocks_other_examples_and_padding(recipe):
    row = recipe.rows[0]
    batch = llm_data.collate([row, llm_data.Row([row.examples[0]], len(recipe.train_examples[row.examples[0]]))],
                             recipe.train_examples, recipe.pad_id)
    mask = batch.attention_mask()[:, 0]
    seg = batch.segment_ids
    L = seg.shape[1]
    for b in range(2):
        for i in range(L):
            for j in range(L):
                expect = (seg[b, i] == seg[b, j] and j <= i and seg[b, i] >= 0) or (i == j and seg[b, i] < 0)
                assert bool(mask[b, i, j]) == bool(expect)
    assert (batch.position_ids[0][seg[0] == 1] == torch.arange(int((seg[0] == 1).sum()))).all()


def test_padded_batch_loss_equals_alone(recipe):
    """Unpacked rows of different lengths in one padded batch give the same losses as alone."""
    rows = [llm_data.Row([i], len(recipe.train_examples[i])) for i in range(4)]
    batch = llm_data.collate(rows, recipe.train_examples, recipe.pad_id)
    with torch.no_grad():
        nll, where = recipe.token_losses(batch)
    alone = _per_example_losses(recipe, rows)
    for b in range(4):
        assert nll[where[:, 0] == b].sum().item() == pytest.approx(alone[b], rel=1e-4, abs=1e-4)
