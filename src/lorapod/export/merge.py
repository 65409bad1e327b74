"""Fold an LLM adapter into its base, in the base's own dtype, and prove it.

Before anything is written the merged model's logits on a fixed input are compared with the
base + adapter (PEFT, unmerged) logits; a difference beyond the dtype's tolerance is an error,
so a merge that silently wrote the base (or a broken model) never reaches the user.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import torch

from lorapod.errors import ExportError

# max |merged - (base + adapter)| over the logits, relative to the largest logit
TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 4e-2}


@dataclass
class MergeReport:
    dtype: str
    max_diff: float  # merged vs base + adapter (relative to the largest logit)
    tolerance: float
    adapter_effect: float  # base + adapter vs base (relative): the adapter really changes the model


def load_base(model_id: str, revision: str | None = None):
    from transformers import AutoModelForCausalLM

    from lorapod.engine.llm import quiet_hf

    quiet_hf()
    try:
        return AutoModelForCausalLM.from_pretrained(model_id, revision=revision, dtype="auto")
    except (OSError, ValueError) as exc:
        raise ExportError(f"could not load the base model {model_id}: {exc}",
                          hint="pass the base with --base PATH (the one the run trained on)") from exc


def attach(base, peft_dir: Path, model_id: str):
    """The adapter on the base; an adapter whose shapes or module names do not fit is an error."""
    from peft import PeftModel

    try:
        model = PeftModel.from_pretrained(base, str(peft_dir))
    except (RuntimeError, ValueError, KeyError) as exc:
        raise ExportError(f"the adapter in {peft_dir} does not fit the base model {model_id}: "
                          f"{str(exc).splitlines()[0][:300]}",
                          hint="merge onto the base the run trained on (see model.id in the run's spec.yaml; "
                               "--base PATH if it moved)") from exc
    return model


def probe_ids(vocab: int, n: int = 24) -> torch.Tensor:
    return torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(0))


@torch.no_grad()
def merge(model_id: str, peft_dir: Path, out: Path, revision: str | None = None) -> MergeReport:
    """Merge into a standard transformers folder at ``out`` (model + tokenizer)."""
    from transformers import AutoTokenizer

    base = load_base(model_id, revision)
    dtype = next(base.parameters()).dtype
    model = attach(base, peft_dir, model_id)
    model.eval()
    ids = probe_ids(base.config.vocab_size)
    with model.disable_adapter():
        plain = model(input_ids=ids).logits.float()
    tuned = model(input_ids=ids).logits.float()
    merged = model.merge_and_unload()
    got = merged(input_ids=ids).logits.float()
    ref = float(tuned.abs().max().clamp_min(1e-6))
    report = MergeReport(str(dtype).removeprefix("torch."), float((got - tuned).abs().max()) / ref,
                         TOLERANCE.get(dtype, 4e-2), float((tuned - plain).abs().max()) / ref)
    if report.max_diff > report.tolerance:
        raise ExportError(f"the merged model differs from base + adapter by {report.max_diff:.2e} (relative), "
                          f"more than {report.tolerance:.0e} allowed for {report.dtype}; nothing was written",
                          hint="report this with the run folder; export --to peft works meanwhile")
    merged.save_pretrained(str(out))
    with contextlib.suppress(OSError, ValueError):  # a base without a tokenizer: the weights are still whole
        AutoTokenizer.from_pretrained(model_id, revision=revision).save_pretrained(str(out))
    return report
