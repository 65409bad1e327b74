"""The LLM LoRA/QLoRA recipe: chat JSONL -> PEFT adapter. Reads top to bottom:

``train_llm`` (setup) -> ``LLMRecipe`` (batches, loss, eval) -> ``loop.fit`` (shared loop) ->
adapter saved in PEFT format (``adapter_config.json`` + ``adapter_model.safetensors``).

The loss is computed on label positions only: the decoder's hidden states are gathered where a
target exists and only those go through the LM head. With assistant-only labels that is a
fraction of the tokens, which saves the (tokens x vocabulary) logits tensor that dominates memory
for large vocabularies.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from lorapod.chat.template import ensure_chat_template, plan_system
from lorapod.chat.tokenize import IGNORE, Example, TokenizeStats, tokenize_all
from lorapod.data.chat_split import Split, load_split  # noqa: F401  (Split: what load_split returns)
from lorapod.engine import attention, distributed, llm_data
from lorapod.engine.checkpoint import TrainState, resume_point
from lorapod.engine.device import Precision, pick_device, resolve_precision
from lorapod.engine.llm_data import Batch, Row
from lorapod.engine.llm_model import add_lora, count_parameters, load_model, load_tokenizer
from lorapod.engine.loop import FitResult, LossOut, fit
from lorapod.errors import DataError
from lorapod.fsutil import atomic_dir, atomic_write_text
from lorapod.rundir import RunDir
from lorapod.rundir.layout import answers_file, sample_tag
from lorapod.spec import JobSpec


class LLMRecipe:
    """Batches, loss and evaluation for a causal LM with a LoRA adapter."""

    unit = "tok/s"

    def __init__(self, spec: JobSpec, precision: Precision, model, tokenizer,
                 train_examples: list[Example], val_examples: list[Example]) -> None:
        self.spec = spec
        self.precision = precision
        self.model = model
        self.tokenizer = tokenizer
        self.train_examples = train_examples
        self.val_examples = val_examples
        seq = spec.data.sequence_len
        self.rows: list[Row] = llm_data.pack(train_examples, seq) if spec.data.packing else llm_data.unpacked(train_examples)
        self.val_rows: list[Row] = llm_data.pack(val_examples, seq) if val_examples else []
        self.pad_id = tokenizer.pad_token_id
        self.attention: attention.AttentionPath = getattr(model.get_base_model(), "lorapod_attention", None) or \
            attention.AttentionPath("sdpa", False, "default")
        self.pad_multiple = self.attention.pad_multiple(precision.device)
        self._epoch_cache: dict[int, list[Batch]] = {}
        base = model.get_base_model()
        self.decoder = base.get_decoder()
        self.head = base.get_output_embeddings()
        self.softcap = getattr(base.config, "final_logit_softcapping", None)
        mask_dtype = precision.autocast_dtype if precision.compute != "fp32" else precision.weights
        self.losses = _TokenLosses(self.decoder, self.head, self.softcap, self.attention, mask_dtype)
        self.sharded = False  # FSDP2 (engine/fsdp.py): every process must run the same passes
        self.run: RunDir | None = None  # where samples go (set by train_llm)

    def shard(self, world: distributed.World) -> None:
        """FSDP2 over the frozen base: each decoder block and the loss module's root."""
        from lorapod.engine import fsdp
        from lorapod.errors import SpecError

        blocks = getattr(self.decoder, "layers", None)
        if not isinstance(blocks, torch.nn.ModuleList):
            raise SpecError(f"{self.spec.model.id}: no decoder.layers to shard with FSDP2",
                            hint="set train.parallel ddp for this architecture")
        # rank 0's whole model (the CPU-staged base and the seeded adapter), kept until it is broadcast
        whole = self.model.state_dict() if world.is_main else None
        fsdp.shard(blocks, self.losses, self.trainable_parameters(), self.precision.device, world)
        fsdp.move_unsharded(self.model, self.precision.device)
        fsdp.load_from_main(self.model, self.losses, whole, self.precision.device, world)
        self.sharded = True

    # -- data
    def epoch_batches(self, epoch: int) -> list[Batch]:
        if epoch not in self._epoch_cache:
            g = torch.Generator().manual_seed(self.spec.train.seed * 1000 + epoch)
            groups = llm_data.batch_rows(self.rows, self.spec.train.micro_batch_size, g, group_by_length=not self.spec.data.packing)
            self._epoch_cache = {epoch: [llm_data.collate(r, self.train_examples, self.pad_id, self.pad_multiple) for r in groups]}
        return self._epoch_cache[epoch]

    def batch_units(self, batch: Batch) -> int:
        return batch.n_labels

    # -- model
    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def train(self) -> None:
        self.model.train()

    def token_losses(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-target NLL and the (row, position) index of each target, on the device."""
        # flattened for flash on the CPU (engine/attention.py), then moved: nothing is read back per layer
        return self.losses(attention.prepare_batch(batch, self.attention).to(self.precision.device))

    def loss(self, batch: Batch) -> LossOut:
        nll, _ = self.token_losses(batch)
        return LossOut(nll.sum(), batch.n_labels, batch.n_tokens, batch.n_real)

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        if not self.val_rows:
            return {}
        self.model.eval()
        total, count = 0.0, 0
        rows = self.val_rows
        bs = max(1, self.spec.train.micro_batch_size)
        starts = list(range(0, len(rows), bs))[: self.spec.eval.max_batches or None]
        world = distributed.current()
        mine = world.share(starts)  # each process evaluates its share; the sums are added up
        # under FSDP every process runs as many passes as the busiest one (the extra ones uncounted)
        passes = -(-len(starts) // world.size) if self.sharded else len(mine)
        for i in range(passes):
            s = mine[i] if i < len(mine) else starts[0]
            batch = llm_data.collate(rows[s : s + bs], self.val_examples, self.pad_id, self.pad_multiple)
            with self.precision.autocast():
                nll, _ = self.token_losses(batch)
            if i < len(mine):
                total += float(nll.sum())
                count += nll.numel()
        total, count = world.all_sum([total, count])
        loss = total / max(count, 1)
        return {"val_loss": loss, "val_ppl": math.exp(min(loss, 50.0))}

    # -- adapter
    def adapter_state(self) -> dict[str, torch.Tensor]:
        from peft import get_peft_model_state_dict

        return get_peft_model_state_dict(self.model)

    def load_adapter_state(self, state: dict[str, torch.Tensor]) -> None:
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(self.model, state)

    def save_final(self, out_dir: Path) -> None:
        with atomic_dir(out_dir) as tmp:
            self.model.save_pretrained(str(tmp))

    def on_save(self, state: TrainState, path: Path | None) -> None:
        return None

    # -- samples: the adapter's answers to samples.prompts, as the trackers show them
    def on_step(self, state: TrainState, run: RunDir) -> None:
        if self.spec.samples.every_steps and state.step % self.spec.samples.every_steps == 0:
            self.write_samples(run, sample_tag(state.step))

    def on_epoch_end(self, state: TrainState) -> None:
        every = self.spec.samples.every_epochs
        if every and state.epoch % every == 0 and self.run is not None:
            self.write_samples(self.run, f"epoch{state.epoch:03d}")

    def write_samples(self, run: RunDir, tag: str) -> Path | None:
        """``samples/<tag>-answers.jsonl``: one {"prompt", "answer"} per prompt (greedy, with the adapter)."""
        from lorapod.spec import prompts_of

        prompts = prompts_of(self.spec)
        if not prompts or self.sharded:  # FSDP: a generate on rank 0 alone would wait for the others forever
            return None
        rows = [{"prompt": p, "answer": generate(self.model, self.tokenizer, [{"role": "user", "content": p}],
                                                 self.spec.samples.max_new_tokens)} for p in prompts]
        path = run.samples / answers_file(tag)
        atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))
        self.train()
        run.event(f"samples {tag}: {len(rows)} answer(s) in {path.name}")
        return path


def generate(model, tokenizer, messages: list[dict], max_new_tokens: int = 48, use_adapter: bool = True) -> str:
    """Greedy reply to ``messages`` (with or without the adapter), for before/after comparisons."""
    from contextlib import nullcontext

    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    enc = tokenizer(prompt, add_special_tokens=False, return_tensors="pt").to(next(model.parameters()).device)
    ctx = nullcontext() if use_adapter else model.disable_adapter()
    was_training = model.training
    model.eval()
    stop = [t for t in {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")} if isinstance(t, int) and t >= 0]
    with ctx, torch.no_grad():
        out = model.generate(
            **enc, max_new_tokens=max_new_tokens, do_sample=False, use_cache=True,
            pad_token_id=tokenizer.pad_token_id, eos_token_id=stop or None,
        )
    if was_training:
        model.train()
    return tokenizer.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True).strip()


def generate_many(model, tokenizer, conversations: list[list[dict]], max_new_tokens: int = 48, use_adapter: bool = True,
                  batch: int = 16) -> list[str]:
    """Greedy replies to many conversations, ``batch`` at a time (left-padded, so every reply starts
    where its prompt ends): the quality autopilot's answers, one generate call per batch instead of
    one per conversation."""
    from contextlib import nullcontext

    if not conversations:
        return []
    prompts = [tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in conversations]
    device = next(model.parameters()).device
    stop = [t for t in {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")} if isinstance(t, int) and t >= 0]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (stop[0] if stop else 0)
    side, was_training = tokenizer.padding_side, model.training
    tokenizer.padding_side = "left"
    model.eval()
    out: list[str] = []
    try:
        for i in range(0, len(prompts), batch):
            enc = tokenizer(prompts[i:i + batch], add_special_tokens=False, return_tensors="pt", padding=True).to(device)
            with (nullcontext() if use_adapter else model.disable_adapter()), torch.no_grad():
                ids = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, use_cache=True,
                                     pad_token_id=pad, eos_token_id=stop or None)
            out += [tokenizer.decode(row[enc["input_ids"].shape[1]:], skip_special_tokens=True).strip() for row in ids]
    finally:
        tokenizer.padding_side = side
        if was_training:
            model.train()
    return out


class _TokenLosses(torch.nn.Module):
    """Decoder + LM head on label positions, as one module: FSDP2's root unit (embeddings, final
    norm, head) gathers its shards in this module's forward, which the loss calls. The decoder
    gets what ``path`` needs (engine/attention.py): padding-free, no mask and the restarting
    position ids (``use_cache=False`` matters: with a cache transformers does not look for packed
    examples); with an explicit mask, lorapod's additive (B, 1, L, L) mask."""

    def __init__(self, decoder: torch.nn.Module, head: torch.nn.Module, softcap: float | None,
                 path: attention.AttentionPath | None = None, mask_dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.decoder = decoder
        self.head = head
        self.softcap = softcap
        self.path = path or attention.AttentionPath("sdpa", False, "default")
        self.mask_dtype = mask_dtype

    def forward(self, b: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        b = attention.prepare_batch(b, self.path)
        out = self.decoder(
            input_ids=b.input_ids,
            use_cache=False,
            **attention.forward_kwargs(b, self.path, self.mask_dtype),
        )
        hidden = out.last_hidden_state[:, :-1]
        targets = b.labels[:, 1:]
        if b.label_pos is not None:  # target positions from collate: indexing them reads nothing back
            flat = b.label_pos[:, 0] * hidden.shape[1] + b.label_pos[:, 1]
            picked = hidden.reshape(-1, hidden.shape[-1]).index_select(0, flat)
            wanted, where_at = targets.reshape(-1).index_select(0, flat), b.label_pos
        else:
            where = targets != IGNORE
            picked, wanted, where_at = hidden[where], targets[where], where.nonzero()
        logits = self.head(picked)
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        nll = F.cross_entropy(logits.float(), wanted, reduction="none")
        return nll, where_at


@dataclass
class LLMRun:
    run: RunDir
    result: FitResult
    recipe: LLMRecipe
    stats: TokenizeStats


def quiet_hf() -> None:
    """Keep the terminal for lorapod's own progress: no HF loading bars, no deprecation noise."""
    import warnings

    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")


def prepare(spec: JobSpec, device: str | None = None, log=print, *,
            stage_on_cpu: bool = False, weights: bool = True) -> tuple[LLMRecipe, TokenizeStats, bool]:
    """Load data, tokenizer and model; attach LoRA; build the recipe. No training yet.

    ``stage_on_cpu`` (FSDP2) loads the base into CPU memory: :meth:`LLMRecipe.shard` then moves
    one block at a time to the GPU as it shards it, so the whole base is never on one GPU.
    ``weights=False`` (FSDP2's ranks other than 0) builds base and adapter on the ``meta`` device
    without reading a weight file: :meth:`LLMRecipe.shard` fills their shards from rank 0's copy.
    """
    quiet_hf()
    if spec.model.dtype == "fp8":
        from lorapod.errors import SpecError

        raise SpecError(
            "model.dtype fp8 is for image and video models; the LLM engine does not train on fp8 weights",
            hint="for a smaller LLM footprint use method.type: qlora (4-bit base)",
        )
    torch.manual_seed(spec.train.seed)
    random.seed(spec.train.seed)
    precision = resolve_precision(spec.train.precision, spec.model.dtype, pick_device(device))
    split, _fmt = load_split(spec, log)
    tokenizer = load_tokenizer(spec)
    fallback = ensure_chat_template(tokenizer)
    seq, only_asst, skip = spec.data.sequence_len, spec.data.train_on_assistant_only, spec.data.skip_bad_examples
    system = None
    if any(c and c[0]["role"] == "system" for c in split.train + split.val):
        system = plan_system(tokenizer, spec.data.system_prompt)
        if system.mode != "keep" or system.refused:
            log(f"system prompt: {system.explanation} (data.system_prompt: {spec.data.system_prompt})")
    train_ex, stats = tokenize_all(tokenizer, split.train, seq, only_asst, system, split.train_where, skip)
    val_ex, val_stats = tokenize_all(tokenizer, split.val, seq, only_asst, system, split.val_where, skip)
    if stats.rejected or val_stats.rejected:
        log(f"skipping {stats.rejected + val_stats.rejected} conversation(s) the chat template refuses "
            "(data.skip_bad_examples)")
    if stats.shared_boundary:
        log(f"[warning] {stats.shared_boundary} token(s) are shared by a prompt and a reply (e.g. a reply that "
            "starts with a newline merges with the header's newline); they are labelled, as transformers' "
            "assistant mask does, so the model also learns that prompt character")
    if not train_ex:
        raise DataError(
            "no training example has an assistant reply left after tokenisation",
            hint="check the data with `lorapod data check`, or raise data.sequence_len",
        )
    # The adapter's initial weights come from the seed alone, whatever reading the data, the
    # tokenizer or building lorapod's built-in model did to the RNG before: a restart from step 0
    # (a run killed before its first checkpoint) then reproduces a fresh run exactly.
    torch.manual_seed(spec.train.seed)
    random.seed(spec.train.seed)
    model = load_model(spec, replace(precision, device=torch.device("cpu")) if stage_on_cpu else precision,
                       precision.device, empty=not weights)
    model = add_lora(model, spec, precision.weights)
    # peft keeps adapter weights in fp32 while the base may be bf16; the seed fixes their init
    recipe = LLMRecipe(spec, precision, model, tokenizer, train_ex, val_ex)
    return recipe, stats, fallback


def train_llm(spec: JobSpec, run: RunDir, *, resume: bool = False, device: str | None = None,
              on_step=None, show_progress: bool | None = None, log=print) -> LLMRun:
    world, device = distributed.init(device)
    log, event = world.only_main(log), world.only_main(run.event)
    mode = "ddp"
    if world.active:
        from lorapod.engine.fsdp import parallel_mode

        mode, why = parallel_mode(spec, world, pick_device(device))
        event(why)
    # FSDP2: only rank 0 reads the base (into CPU RAM); the others build it on `meta` and get their
    # shards from rank 0 in recipe.shard: host RAM for one base, not one per process (review G14)
    recipe, stats, fallback = prepare(spec, device, log, stage_on_cpu=mode == "fsdp",
                                      weights=mode != "fsdp" or world.is_main)
    if mode == "fsdp":
        from lorapod.engine.fsdp import local_share

        recipe.shard(world)
        held, whole = local_share(recipe.model)
        event(f"FSDP2: rank 0 holds {held:,} of the {whole:,} sharded base parameters")
    trainable, total = count_parameters(recipe.model)
    log(f"model {spec.model.id}: {total:,} parameters, {trainable:,} trainable ({100 * trainable / total:.2f}%)")
    log(f"data: {stats.examples} training examples ({len(recipe.rows)} rows"
        f"{' packed' if spec.data.packing else ''}), {len(recipe.val_examples)} validation; "
        f"{stats.truncated} truncated to {spec.data.sequence_len} tokens, {stats.dropped_no_labels} without an assistant reply dropped")
    if fallback:
        log("the tokenizer has no chat template: using lorapod's ChatML fallback (see docs/llm.md)")
    event(f"training {spec.model.id} on {recipe.precision.device} ({recipe.precision.compute})"
          + (f", {world.size} processes" if world.active else ""))
    event(recipe.attention.describe(recipe.precision.device))
    checkpoint = resume_point(run.checkpoints, event, log) if resume and world.is_main else None
    recipe.run = run

    def step_hook(state, loss):
        recipe.on_step(state, run)
        if on_step is not None:
            on_step(state, loss)

    autopilot = None
    if world.is_main and spec.quality.score != "off":
        from lorapod.engine.autopilot import llm_autopilot
        from lorapod.quality.autopilot import Autopilot

        if world.active:  # the evaluation's all-reduce would wait for the other processes forever
            autopilot = Autopilot(spec, run.root, None, f"a run of {world.size} processes is not scored while it "
                                  "trains (score it afterwards with `lorapod eval`)", log, run.event)
            autopilot.start()
        else:
            autopilot = llm_autopilot(spec, run, recipe, log, load_split(spec, log=lambda m: None)[0].val,
                                      generate_many)
    result = fit(recipe, spec, run, recipe.precision, resume=checkpoint, on_step=step_hook, show_progress=show_progress,
                 judge=autopilot)
    return LLMRun(run, result, recipe, stats)
