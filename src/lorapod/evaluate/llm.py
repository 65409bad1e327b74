"""``lorapod eval RUN`` for LLM runs: which checkpoint to keep, and why.

Validation loss and perplexity of the base model and of every checkpoint (the same rows and batch
limit the trainer evaluates on), a table and a PNG, held-out prompts answered by the base and the
recommended checkpoint side by side with greedy decoding (deterministic), and the recommendation:
the checkpoint with the lowest validation loss, saying where the loss turned up again (the later
checkpoints are over-fitting) when it did.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lorapod.engine.checkpoint import CheckpointManager
from lorapod.errors import DataError, ExportError
from lorapod.fsutil import atomic_write_text
from lorapod.rundir import RunDir
from lorapod.rundir.layout import checkpoint_step


@dataclass
class Row:
    label: str  # 'base', 'step-N'
    step: int | None
    val_loss: float
    val_ppl: float


@dataclass
class LLMEval:
    rows: list[Row]
    best: str
    reason: str
    answers: list[dict[str, str]] = field(default_factory=list)  # prompt, base, tuned
    files: list[str] = field(default_factory=list)
    quality: dict = field(default_factory=dict)  # the quality autopilot's decision (quality/pick.json)


def recommend(rows: list[Row]) -> tuple[str, str]:
    base = next(r for r in rows if r.step is None)
    ckpts = [r for r in rows if r.step is not None]
    best = min(ckpts, key=lambda r: r.val_loss)
    later = [r for r in ckpts if r.step > best.step]
    gain = base.val_loss - best.val_loss
    if gain <= 0:
        return best.label, (f"no checkpoint beats the base model on validation loss ({base.val_loss:.4f}); "
                            "check the data and learning rate before exporting")
    why = f"lowest validation loss {best.val_loss:.4f} (base {base.val_loss:.4f}, perplexity {best.val_ppl:.2f})"
    if later:
        last = later[-1]
        why += (f"; validation loss turned up after it (to {last.val_loss:.4f} at {last.label}): "
                "later checkpoints over-fit" if last.val_loss > best.val_loss * 1.005 else "; later checkpoints are no better")
    else:
        why += _at_the_end(ckpts, best, gain)
    return best.label, why


#: Within this share of the whole gain over the base (or 0.5% of the loss, if more), two validation
#: losses count as the same: seed noise on a small validation set moves it about that much.
FLAT_SHARE = 0.02


def _at_the_end(ckpts: list[Row], best: Row, gain: float) -> str:
    """The best is the last checkpoint: still falling (more training may help) or flat for a while
    (it will not, much). A curve that has sat within noise of its end for 240 steps is flat, however
    slightly its last value is the lowest."""
    tol = max(FLAT_SHARE * gain, 0.005 * best.val_loss)
    since = next((r for r in ckpts if r.step < best.step and r.val_loss - best.val_loss <= tol
                  and all(x.val_loss - best.val_loss <= tol for x in ckpts if x.step >= r.step)), None)
    if since is not None:
        return (f"; validation loss has been flat since {since.label} (within {tol:.4f} over "
                f"{best.step - since.step} steps), so more training is unlikely to help; {since.label} is as good")
    prev = max((r for r in ckpts if r.step < best.step), key=lambda r: r.step, default=None)
    still = f" (down {prev.val_loss - best.val_loss:.4f} since {prev.label})" if prev is not None else ""
    return f"; it is the last checkpoint and the loss was still falling{still}, so more training may still help"


def read_prompts(path: Path | None, spec, n: int) -> list[list[dict]]:
    """Conversations to answer: one user message per line of ``path``, or the first ``n`` held-out
    conversations up to their first user message (their system prompt included)."""
    if path is not None:
        if not Path(path).is_file():
            raise DataError(f"{path} does not exist", hint="give a text file with one prompt per line")
        lines = [ln.strip() for ln in Path(path).read_text(encoding="utf-8").splitlines() if ln.strip()]
        return [[{"role": "user", "content": ln}] for ln in lines[:n]]
    from lorapod.engine.llm import load_split

    split, _ = load_split(spec, log=lambda m: None)
    out = []
    for conv in split.val:
        idx = next((i for i, m in enumerate(conv) if m.get("role") == "user"), None)
        if idx is not None:
            out.append(conv[: idx + 1])
    return out[:n]


def evaluate_llm(run_path: str | Path, prompts: Path | None = None, n_prompts: int = 4, device: str | None = None,
                 max_new_tokens: int = 48, log=print, score: bool = True) -> LLMEval:
    import torch

    from lorapod.engine.llm import generate, prepare
    from lorapod.spec import load_spec

    run = RunDir.open(run_path)
    spec = load_spec(run.spec_file)
    mgr = CheckpointManager(run.checkpoints)
    external = run.recorded_trainer()  # an external trainer's (axolotl's) PEFT checkpoints
    steps = [p for p in mgr.list() if mgr.verify(p) or (external and _peft_file(p) is not None)]
    if not steps:
        raise ExportError(f"{run.root} has no complete checkpoint to evaluate",
                          hint="train first, or pull the remote run's checkpoints")
    torch.manual_seed(0)
    recipe, _stats, _fb = prepare(spec, device, log=lambda m: None)
    if not recipe.val_rows:
        raise DataError("this run has no validation data, so its checkpoints cannot be compared",
                        hint="set data.val_path or data.val_split in the run's spec.yaml")
    model = recipe.model
    with model.disable_adapter():
        m = recipe.evaluate()
    rows = [Row("base", None, m["val_loss"], m["val_ppl"])]
    for path in steps:
        _load(recipe, mgr, path)
        m = recipe.evaluate()
        rows.append(Row(path.name, checkpoint_step(path.name), m["val_loss"], m["val_ppl"]))
        log(f"{path.name}: val loss {m['val_loss']:.4f}")
    best, reason = recommend(rows)
    decision = _quality(spec, run, recipe, steps, log) if score else {}
    if decision.get("checkpoint") in {p.name for p in steps}:
        best, reason = decision["checkpoint"], f"quality autopilot: {decision.get('reason')}; by validation loss: {reason}"
    _load(recipe, mgr, run.checkpoints / best)
    answers = []
    for msgs in read_prompts(prompts, spec, n_prompts):
        answers.append({"prompt": msgs[-1]["content"], "base": generate(model, recipe.tokenizer, msgs, max_new_tokens, use_adapter=False),
                        "tuned": generate(model, recipe.tokenizer, msgs, max_new_tokens, use_adapter=True)})
    result = LLMEval(rows, best, reason, answers, quality=decision)
    out = run.root / "eval"
    out.mkdir(exist_ok=True)
    atomic_write_text(out / "eval.json", json.dumps(asdict(result), indent=2))
    atomic_write_text(out / "eval.md", render(result))
    result.files = ["eval/eval.json", "eval/eval.md"]
    if plot(rows, out / "val_loss.png"):
        result.files.append("eval/val_loss.png")
    atomic_write_text(out / "llm.html", page(result, run.root.name, (out / "val_loss.png").is_file()))
    result.files.append("eval/llm.html")
    run.event(f"eval: recommended {best} ({reason})")
    return result


def _peft_file(path: Path) -> Path | None:
    f = path / "adapter_model.safetensors"
    return f if f.is_file() and not f.is_symlink() else None


def _load(recipe, mgr: CheckpointManager, path: Path) -> None:
    """A checkpoint's adapter into the recipe's model: lorapod's own (verified against its manifest),
    or an external trainer's PEFT adapter (engine/autopilot.py ``load_peft_adapter`` refuses one
    that is not this run's LoRA)."""
    if mgr.verify(path):
        recipe.load_adapter_state(mgr.load(path).adapter())
        return
    from safetensors.torch import load_file

    from lorapod.engine.autopilot import load_peft_adapter, peft_adapter_config

    file = _peft_file(path)
    if file is None:
        raise ExportError(f"checkpoint {path} is incomplete or damaged", hint="pick another checkpoint")
    try:
        load_peft_adapter(recipe, load_file(str(file)), file, peft_adapter_config(path))
    except ValueError as exc:
        raise ExportError(str(exc), hint="this checkpoint is not the run's LoRA (its spec's method.r, alpha, "
                                          "target modules)") from exc


def _quality(spec, run: RunDir, recipe, steps: list[Path], log) -> dict:
    """The autopilot's scores (quality/): those made while training, the checkpoints it missed now."""
    from lorapod.engine.autopilot import llm_autopilot
    from lorapod.engine.llm import generate_many, load_split
    from lorapod.quality.autopilot import Autopilot
    from lorapod.rundir import quality as files

    mgr = CheckpointManager(run.checkpoints)
    if run.recorded_trainer() and not spec.data.val_path:  # the rows lorapod would hold out, the trainer saw
        pilot: Autopilot | None = Autopilot(
            spec, run.root, None, f"{run.recorded_trainer()} drew its own validation split (data.val_split), so "
            "lorapod cannot tell which conversations it never trained on: give them in data.val_path to score its "
            "checkpoints", log, run.event)
        pilot.start()
        return files.read_json(run.root, files.PICK) or {}
    pilot = llm_autopilot(spec, run, recipe, log, load_split(spec, log=lambda m: None)[0].val, generate_many)
    if pilot is None:
        return {}
    for path in steps:
        step = checkpoint_step(path.name)
        if step is None or pilot.scored(step) or pilot.scoring is None:
            continue
        _load(recipe, mgr, path)
        pilot.on_checkpoint(step, step)  # total = step: nothing left to stop
    return files.read_json(run.root, files.PICK) or {}


def render(r: LLMEval) -> str:
    lines = ["| checkpoint | val loss | perplexity |", "|---|---:|---:|"]
    lines += [f"| {row.label}{' (recommended)' if row.label == r.best else ''} | {row.val_loss:.4f} | "
              f"{row.val_ppl:.2f} |" for row in r.rows]
    lines += ["", f"Recommended: **{r.best}**: {r.reason}.", ""]
    table = r.quality.get("table") or []
    if table:
        lines += ["| checkpoint | quality score (vs base) | ± se |", "|---|---:|---:|"]
        lines += [f"| {t.get('checkpoint')}{' (pick)' if t.get('checkpoint') == r.quality.get('checkpoint') else ''} | "
                  + (f"{t['best']['score']:+.4f} | {t['best']['se']:.4f} |" if t.get("best") else "- | - |")
                  for t in table]
        lines.append("")
    if r.answers:
        lines += ["## Answers (greedy decoding)", ""]
        for a in r.answers:
            lines += [f"**Prompt:** {a['prompt']}", "", f"- base: {a['base']}", f"- {r.best}: {a['tuned']}", ""]
    return "\n".join(lines)


def page(r: LLMEval, title: str, with_plot: bool) -> str:
    """The same as eval.md, as a page to open in a browser (the image eval has one too)."""
    import html

    esc = html.escape
    rows = "".join(f"<tr{' style=font-weight:bold' if row.label == r.best else ''}><td>{esc(row.label)}"
                   f"{' (recommended)' if row.label == r.best else ''}</td><td>{row.val_loss:.4f}</td>"
                   f"<td>{row.val_ppl:.2f}</td></tr>" for row in r.rows)
    parts = [f"<!doctype html><meta charset=utf-8><title>{esc(title)} eval</title>",
             "<style>body{font-family:sans-serif;max-width:60em}td,th{padding:2px 10px;text-align:right}"
             "td:first-child{text-align:left}</style>", f"<h1>{esc(title)}</h1>",
             f"<table><tr><th>checkpoint</th><th>val loss</th><th>perplexity</th></tr>{rows}</table>",
             f"<p>Recommended: <b>{esc(r.best)}</b>: {esc(r.reason)}.</p>"]
    if with_plot:
        parts.append("<img src='val_loss.png' alt='validation loss per checkpoint (log scale)'>")
    if r.answers:
        parts.append("<h2>Answers (greedy decoding)</h2><table><tr><th>prompt</th><th>base</th>"
                     f"<th>{esc(r.best)}</th></tr>")
        parts += [f"<tr><td>{esc(a['prompt'])}</td><td style=text-align:left>{esc(a['base'])}</td>"
                  f"<td style=text-align:left>{esc(a['tuned'])}</td></tr>" for a in r.answers]
        parts.append("</table>")
    return "\n".join(parts) + "\n"


def plot(rows: list[Row], out: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, best = val_loss_figure(rows, plt)
    fig.savefig(out)
    plt.close(fig)
    return not math.isnan(best.val_loss)


def val_loss_figure(rows: list[Row], plt):
    """Checkpoints' validation loss against the base's. A log axis: a tuned loss of 0.02 under a base
    of 8.7 is a flat line at the bottom of a linear one."""
    ck = [r for r in rows if r.step is not None]
    base = rows[0]
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=110)
    ax.plot([r.step for r in ck], [r.val_loss for r in ck], "o-", color="#e6550d", label="checkpoints")
    ax.axhline(base.val_loss, color="#636363", linestyle="--", label=f"base {base.val_loss:.3f}")
    best = min(ck, key=lambda r: r.val_loss)
    ax.plot([best.step], [best.val_loss], "*", color="#31a354", markersize=14, label=f"lowest: {best.label}")
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss")
    if all(r.val_loss > 0 and math.isfinite(r.val_loss) for r in rows):
        ax.set_yscale("log")
        ax.set_ylabel("validation loss (log scale)")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    return fig, best
