"""The conversations a chat job trains on, read once for training and for the plan.

:func:`load_split` is what the LLM engine trains on (``engine/llm.py``) and what ``lorapod plan``
sizes the job by (``plan/job.py``): the same reader (a line over the 4 MiB limit that ``lorapod
data check`` refuses is not read), the same bad-line policy and the same seeded validation
split. :func:`trained_tokens` counts a conversation as training keeps it: cut at
``data.sequence_len``, as ``chat.tokenize.tokenize_conversation`` cuts it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lorapod.data.chat import approx_tokens, load_numbered
from lorapod.errors import DataError
from lorapod.spec import JobSpec


@dataclass
class Split:
    train: list[list[dict]]
    val: list[list[dict]]
    train_where: list[str] | None = None  # "file line N" of each conversation, for errors at train time
    val_where: list[str] | None = None


def read_chat(path: Path, spec: JobSpec, log: Callable[[str], object]) -> tuple[list[list[dict]], str, list[str]]:
    """Conversations of one file (and where each is). Lines with errors stop the job (listed with
    their line numbers) unless ``data.skip_bad_examples`` is set, then they are skipped and counted."""
    numbered, findings, fmt = load_numbered(path, spec.data.format, refuse_empty=True)
    convs = [c for _, c in numbered]
    where = [f"{path.name} line {line}" for line, _ in numbered]
    errors = [f for f in findings if f.severity == "error"]
    if errors and not spec.data.skip_bad_examples:
        shown = "\n".join(f"    line {f.line}: {f.message}" for f in errors[:5])
        more = f"\n    ... and {len(errors) - 5} more" if len(errors) > 5 else ""
        raise DataError(
            f"{path} has {len(errors)} bad line(s):\n{shown}{more}",
            hint=f"fix them (`lorapod data check {path}` lists all), or --set data.skip_bad_examples=true",
        )
    if errors:
        log(f"{path}: skipping {len(errors)} bad line(s) (data.skip_bad_examples)")
    return convs, fmt, where


def load_split(spec: JobSpec, log: Callable[[str], object] = print) -> tuple[Split, str]:
    """Read the conversations and split off validation (seeded), or read data.val_path."""
    conversations: list[list[dict]] = []
    wheres: list[str] = []
    formats = set()
    for path in spec.data_paths():
        convs, fmt, where = read_chat(Path(path), spec, log)
        conversations.extend(convs)
        wheres.extend(where)
        formats.add(fmt)
    if spec.data.val_path:
        val, _fmt, val_where = read_chat(Path(spec.data.val_path), spec, log)
        return Split(conversations, val, wheres, val_where), "/".join(sorted(formats))
    order = list(range(len(conversations)))
    random.Random(spec.train.seed).shuffle(order)
    n_val = round(len(conversations) * spec.data.val_split)
    if spec.data.val_split > 0 and len(conversations) >= 2:
        n_val = max(1, n_val)
    n_val = min(n_val, len(conversations) - 1)
    val = [conversations[i] for i in order[:n_val]]
    train = [conversations[i] for i in order[n_val:]]
    return Split(train, val, [wheres[i] for i in order[n_val:]], [wheres[i] for i in order[:n_val]]), \
        "/".join(sorted(formats))


def trained_tokens(messages: list[dict], sequence_len: int, count: Callable[[list[dict]], int] = approx_tokens) -> int:
    """Tokens of one conversation as training keeps them: ``count`` (the chars/4 approximation
    without a tokenizer) cut at ``sequence_len``."""
    return min(count(messages), sequence_len)
