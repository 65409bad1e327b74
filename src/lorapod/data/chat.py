"""Chat JSONL: read, detect the format, normalise to messages, and check every line.

This module is the one parser of chat data in lorapod: ``lorapod data check`` and the LLM
training engine both call ``load_conversations``, so a file that passes the check is exactly the
file the engine trains on (no second parser that disagrees about ShareGPT vs alpaca).

Three formats are accepted, one per file:

- ``messages``: ``{"messages": [{"role": "system"|"user"|"assistant", "content": "..."}]}``
- ``sharegpt``: ``{"conversations": [{"from": "human"|"gpt"|"system", "value": "..."}]}``
- ``alpaca``: ``{"instruction": "...", "input": "...", "output": "..."}`` (``input``, ``system`` optional)

A file that mixes formats is refused (training names the first conflicting line; ``data check``
names every line not in the first line's format): guessing per line is how a ShareGPT file ends
up half-read as alpaca.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lorapod.chat.template import ensure_chat_template, place_system, plan_system
from lorapod.chat.template import render as render_template
from lorapod.chat.tokenize import tokenize_conversation
from lorapod.data.findings import Finding, Report, finding
from lorapod.errors import DataError

FORMATS = ("messages", "sharegpt", "alpaca")
ROLES = ("system", "user", "assistant")

# ShareGPT speaker names seen in the wild, mapped to chat roles. Anything else is passed
# through unchanged so that validate_messages reports it with its line number.
SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
}


def _classify(record: dict[str, Any]) -> str | None:
    """The format one record is written in, or None when it has none of the known keys."""
    if "conversations" in record:
        return "sharegpt"
    if "messages" in record:
        turns = record["messages"]
        # LLaMA-Factory style: ShareGPT speakers under a "messages" key.
        if isinstance(turns, list) and turns and isinstance(turns[0], dict) and "from" in turns[0]:
            return "sharegpt"
        return "messages"
    if "instruction" in record and "output" in record:
        return "alpaca"
    return None


def detect_format(records: list[tuple[int, dict]]) -> str:
    """Name the single format of a file's records ("messages", "sharegpt" or "alpaca").

    Records that match no format are ignored here (``load_conversations`` reports them as missing
    keys). Raises DataError naming the first line whose format differs from the first record's,
    or when no record matches any format.
    """
    first: tuple[int, str] | None = None
    for line, record in records:
        fmt = _classify(record)
        if fmt is None:
            continue
        if first is None:
            first = (line, fmt)
        elif fmt != first[1]:
            raise DataError(
                f"mixed chat formats: line {first[0]} is {first[1]} but line {line} is {fmt}.",
                hint="Convert the file to one format (lorapod reads messages, sharegpt or alpaca), "
                "or split it into one file per format.",
            )
    if first is None:
        raise DataError(
            "no line looks like a chat example: expected a 'messages' list, a ShareGPT "
            "'conversations' list, or alpaca 'instruction'/'output' keys.",
            hint='Each line should look like {"messages": [{"role": "user", "content": "..."}, '
            '{"role": "assistant", "content": "..."}]}.',
        )
    return first[1]


#: The longest line read, by default. 4 MiB is about a million tokens of English (4 bytes a token),
#: far past any sequence_len trained on; a longer line is reported at once, never parsed: a 50 MB
#: line used to keep `data check --model` busy for minutes at 9.5 GB (the JSON, the rendered
#: template and the fast tokenizer's encoding each hold it again, several times over).
MAX_LINE_BYTES = 4 * 2**20


def _size(n: int) -> str:
    return f"{n // 2**20} MiB" if n >= 2**20 and n % 2**20 == 0 else f"{n // 1024} KiB" if n >= 1024 else f"{n} bytes"


def _lines(fh, limit: int) -> Iterator[bytes | None]:
    """Lines of a binary file, with None for a line over ``limit`` bytes (skipped in bounded
    chunks, never held whole: memory stays within ``limit`` whatever the file holds)."""
    while True:
        raw = fh.readline(limit)
        if not raw:
            return
        if len(raw) >= limit and not raw.endswith(b"\n"):
            while True:  # skip the rest of the giant line in bounded chunks
                rest = fh.readline(limit)
                if not rest or rest.endswith(b"\n"):
                    break
            yield None
            continue
        yield raw


def read_jsonl(path: Path, max_line_bytes: int | None = None) -> tuple[list[tuple[int, dict]], list[Finding]]:
    """Read a JSON-lines file into ``(line_number, record)`` pairs, line numbers 1-based.

    The file is streamed line by line; a line over ``max_line_bytes`` (default
    :data:`MAX_LINE_BYTES`) is a finding and is skipped without being held in memory.

    A bad line becomes a Finding (bad JSON, not UTF-8, not an object, cut off at the end of the
    file) rather than an exception, so one typo on line 812 does not hide the rest of the file.
    Raises DataError only when the file itself cannot be read.
    """
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path} does not exist.", hint="Check the path (data.path in the spec).")
    if path.is_dir():
        raise DataError(f"{path} is a folder, not a JSONL file.", hint="Point at the .jsonl file itself.")
    records: list[tuple[int, dict]] = []
    findings: list[Finding] = []
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror}.", hint="Check the file's permissions.") from exc
    limit = int(max_line_bytes or MAX_LINE_BYTES)
    with fh:
        for lineno, raw in enumerate(_lines(fh, limit), start=1):
            if raw is None:
                findings.append(finding(
                    "error", "chat-line-too-long", path,
                    f"line longer than {_size(limit)} (binary data, a file without newlines, or one "
                    "example far past any sequence length?); not read, and not trained on. "
                    "`lorapod data check --max-line-mb N` reads longer lines.", lineno,
                ))
                continue
            complete = raw.endswith(b"\n")
            try:
                text = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                findings.append(finding(
                    "error", "chat-not-utf8", path,
                    f"line is not valid UTF-8 (byte {exc.start}); re-save the file as UTF-8.", lineno,
                ))
                continue
            text = text.strip()
            if not text:
                continue
            if lineno == 1 and text.startswith("["):
                findings.append(finding(
                    "error", "chat-json-array", path,
                    "this is a JSON array, not JSON lines (one object per line); convert it, "
                    "e.g. `jq -c '.[]' in.json > out.jsonl`.", lineno,
                ))
                return [], findings
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                if not complete:
                    findings.append(finding(
                        "error", "chat-truncated-line", path,
                        "the last line is cut off (no newline, incomplete JSON): the file was probably "
                        "truncated while copying; copy it again or delete the partial line.", lineno,
                    ))
                else:
                    findings.append(finding(
                        "error", "chat-bad-json", path,
                        f"invalid JSON at column {exc.colno}: {exc.msg}; fix or delete this line.", lineno,
                    ))
                continue
            if not isinstance(obj, dict):
                findings.append(finding(
                    "error", "chat-not-object", path,
                    f"line holds a JSON {type(obj).__name__}, not an object; each line must be one example.",
                    lineno,
                ))
                continue
            records.append((lineno, obj))
    return records, findings


def _text(value: Any, where: str) -> str:
    """Content as a string; OpenAI-style lists of text parts are joined, anything else refused."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, list) and all(isinstance(p, dict) for p in value):
        parts = [p.get("text") for p in value if p.get("type", "text") == "text"]
        if all(isinstance(p, str) for p in parts) and len(parts) == len(value):
            return "".join(parts)
    raise DataError(f"{where} must be a string, not {type(value).__name__}.")


def to_messages(record: dict, fmt: str) -> list[dict]:
    """Normalise one record to ``[{"role": ..., "content": str}, ...]``.

    ShareGPT speakers (human/gpt/system and common aliases) become user/assistant/system; an
    unknown speaker or role is kept as written so ``validate_messages`` can name it. Raises
    DataError when the record lacks the keys of ``fmt`` or a value has the wrong type.
    """
    if fmt == "messages":
        turns = record.get("messages")
        if not isinstance(turns, list):
            raise DataError("missing 'messages' list.")
        out = []
        for i, turn in enumerate(turns):
            if not isinstance(turn, dict) or "role" not in turn or "content" not in turn:
                raise DataError(f"messages[{i}] needs 'role' and 'content' keys.")
            out.append({"role": str(turn["role"]), "content": _text(turn["content"], f"messages[{i}].content")})
        return out
    if fmt == "sharegpt":
        key = "conversations" if "conversations" in record else "messages"
        turns = record.get(key)
        if not isinstance(turns, list):
            raise DataError("missing 'conversations' list.")
        out = []
        for i, turn in enumerate(turns):
            if not isinstance(turn, dict) or "from" not in turn or "value" not in turn:
                raise DataError(f"{key}[{i}] needs 'from' and 'value' keys.")
            speaker = str(turn["from"])
            role = SHAREGPT_ROLES.get(speaker.lower(), speaker)
            out.append({"role": role, "content": _text(turn["value"], f"{key}[{i}].value")})
        if isinstance(record.get("system"), str) and record["system"].strip() and (
            not out or out[0]["role"] != "system"
        ):
            out.insert(0, {"role": "system", "content": record["system"]})
        return out
    if fmt == "alpaca":
        if "instruction" not in record or "output" not in record:
            raise DataError("alpaca records need 'instruction' and 'output' keys.")
        instruction = _text(record["instruction"], "instruction")
        extra = _text(record.get("input"), "input")
        user = f"{instruction}\n\n{extra}" if extra.strip() else instruction
        out = []
        system = _text(record.get("system"), "system")
        if system.strip():
            out.append({"role": "system", "content": system})
        out.append({"role": "user", "content": user})
        out.append({"role": "assistant", "content": _text(record["output"], "output")})
        return out
    raise DataError(f"unknown chat format {fmt!r}.", hint=f"Use one of: {', '.join(FORMATS)}.")


def validate_messages(messages: list[dict], line: int | None, path: str = "") -> list[Finding]:
    """Check one normalised conversation; errors make it unusable, warnings do not.

    The rules are those chat templates enforce (Llama, Mistral and Gemma templates raise on
    roles that do not alternate) plus what makes an example train nothing (no assistant turn).
    """
    out: list[Finding] = []
    if not messages:
        return [finding("error", "chat-empty-conversation", path, "the conversation has no turns.", line)]
    for i, msg in enumerate(messages):
        role = msg["role"]
        if role not in ROLES:
            out.append(finding(
                "error", "chat-unknown-role", path,
                f"turn {i} has unknown role {role!r}; use system, user or assistant "
                "(ShareGPT: system, human, gpt).", line,
            ))
        if not msg["content"].strip():
            sev = "warning" if role == "system" else "error"
            out.append(finding(sev, "chat-empty-content", path, f"turn {i} ({role}) has empty content; "
                               "write it or remove the turn.", line))
        if role == "system" and i != 0:
            out.append(finding("error", "chat-system-not-first", path,
                               f"system message at turn {i}; it must be the first turn.", line))
    roles = [m["role"] for m in messages]
    if "assistant" not in roles:
        out.append(finding("error", "chat-no-assistant", path,
                           "no assistant turn: this example would train nothing; add the answer.", line))
    for i in range(1, len(roles)):
        if roles[i] == roles[i - 1] and roles[i] in ("user", "assistant"):
            out.append(finding(
                "error", "chat-consecutive-roles", path,
                f"turns {i - 1} and {i} are both {roles[i]}; merge them so user and assistant alternate.",
                line,
            ))
            break
    body = [r for r in roles if r != "system"]
    if body and body[0] == "assistant":
        out.append(finding("warning", "chat-assistant-first", path,
                           "the conversation starts with the assistant; many chat templates expect the user first.",
                           line))
    if body and body[-1] != "assistant" and "assistant" in body:
        out.append(finding("warning", "chat-ends-with-user", path,
                           "the last turn is not the assistant's; it will not be trained on.", line))
    return out


def load_numbered(path: Path, fmt: str = "auto", refuse_empty: bool = False, max_line_bytes: int | None = None,
                  mixed: bool = False) -> tuple[list[tuple[int, list[dict]]], list[Finding], str]:
    """Usable conversations with their 1-based line numbers, the findings, and the format.

    The line numbers let checks that need the model's tokenizer (the chat template) report the
    line, in ``data check`` and at train time alike. ``refuse_empty``: raise DataError (naming
    the first problem) when no example is usable. ``mixed``: a file that mixes formats is read in
    its first line's format and every line in another is an error finding (``data check`` reports
    them all, with everything else wrong); without it (training) the mix is a DataError.
    """
    numbered, findings, fmt = _numbered(Path(path), fmt, max_line_bytes, mixed)
    if refuse_empty and not numbered:
        first = next((f for f in findings if f.severity == "error"), None)
        detail = f" (first problem, line {first.line}: {first.message})" if first else " (the file is empty)"
        raise DataError(
            f"{path}: no usable chat example{detail}",
            hint=f"Run `lorapod data check {path}` to see every problem with its line number.",
        )
    return numbered, findings, fmt


def _numbered(path: Path, fmt: str, max_line_bytes: int | None = None, mixed: bool = False,
              ) -> tuple[list[tuple[int, list[dict]]], list[Finding], str]:
    records, findings = read_jsonl(path, max_line_bytes)
    if not records:
        return [], findings, fmt
    first: tuple[int, str] | None = None
    if fmt == "auto":
        if mixed:
            first = next(((ln, k) for ln, r in records if (k := _classify(r)) is not None), None)
        fmt = first[1] if first is not None else detect_format(records)
    elif fmt not in FORMATS:
        raise DataError(f"unknown chat format {fmt!r}.", hint=f"Use auto or one of: {', '.join(FORMATS)}.")
    conversations: list[tuple[int, list[dict]]] = []
    for line, record in records:
        kind = _classify(record)
        if first is not None and kind is not None and kind != fmt:
            findings.append(finding(
                "error", "chat-mixed-format", str(path),
                f"this line is {kind} but the file is {fmt} (line {first[0]}); one format per file: convert "
                f"it, or move the {kind} lines to a file of their own.", line,
            ))
            continue
        if kind is None or kind != fmt:
            findings.append(finding(
                "error", "chat-missing-keys", str(path),
                f"not a {fmt} example (keys: {', '.join(sorted(record)) or 'none'}); "
                f"every line needs the keys of the {fmt} format.", line,
            ))
            continue
        try:
            messages = to_messages(record, fmt)
        except DataError as exc:
            findings.append(finding("error", "chat-missing-keys", str(path), exc.message, line))
            continue
        problems = validate_messages(messages, line, str(path))
        findings.extend(problems)
        if not any(p.severity == "error" for p in problems):
            conversations.append((line, messages))
    return conversations, findings, fmt


def load_conversations(path: Path, fmt: str = "auto") -> tuple[list[list[dict]], list[Finding], str]:
    """Read a chat file into usable conversations, the findings about it, and its format.

    An example with any error finding is left out of the returned conversations (and named in the
    findings). Raises DataError on a mixed-format file or when no example is usable.
    """
    numbered, findings, fmt = load_numbered(path, fmt, refuse_empty=True)
    return [c for _, c in numbered], findings, fmt


# ---------------------------------------------------------------------------------------------
# Token lengths


def approx_tokens(messages: list[dict]) -> int:
    """Token count without a tokenizer: ceil(ASCII chars / 4) + 1 per non-ASCII char + 4 per turn.

    BPE tokenizers average about 4 characters per token on English text and close to one token
    per CJK character; 4 tokens per turn stand for the template's role markers. It errs long on
    purpose: over-estimating truncation is cheaper than discovering it after training.
    """
    total = 0
    for m in messages:
        content = m["content"]
        non_ascii = len(content) - len(content.encode("ascii", "ignore"))  # chars > 127, at C speed
        total += math.ceil((len(content) - non_ascii) / 4) + non_ascii + 4
    return total


def render_plain(messages: list[dict]) -> str:
    """What lengths are counted on when the tokenizer has no chat template."""
    return "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages)


def load_tokenizer(model: Path | str):
    """The model's tokenizer through lorapod's one loader (local folder, hub id, catalog alias)."""
    from lorapod.tokenizer import load_tokenizer as load

    return load(str(model))


def template_check(tokenizer, numbered: list[tuple[int, list[dict]]], path: Path, system_prompt: str = "auto",
                   assistant_only: bool = True):
    """(token lengths, findings, system-prompt plan) from tokenising every conversation as the engine will.

    A conversation the template refuses (Gemma on a system prompt with ``data.system_prompt: keep``,
    roles it will not alternate) or whose replies cannot be located becomes an error finding on its
    line; how the system prompt is placed is said once; tokens shared by prompt and reply are
    counted (they are labelled, as transformers does).
    """
    findings: list[Finding] = []
    system = None
    with_system = [line for line, c in numbered if c and c[0]["role"] == "system"]
    if with_system:
        system = plan_system(tokenizer, system_prompt)
        if system.mode != "keep" and not system.refused:
            findings.append(finding(
                "warning" if system.placement == "last_user" else "info", "chat-system-folded", path,
                f"{len(with_system)} conversation(s) have a system prompt (first: line {with_system[0]}); "
                f"{system.explanation}. Set data.system_prompt to choose (first_user, last_user, or keep to refuse).",
                with_system[0],
            ))
    lengths: list[int] = []
    shared_lines: list[int] = []
    for line, messages in numbered:
        try:
            ex, _truncated, shared = tokenize_conversation(tokenizer, messages, 10**9, assistant_only, system)
        except DataError as exc:
            code = "chat-system-rejected" if system is not None and system.refused and line in with_system \
                else "chat-template-error"
            findings.append(finding("error", code, path, f"{exc.message}" + (f" ({exc.hint})" if exc.hint else ""),
                                    line))
            continue
        lengths.append(len(ex))
        if shared:
            shared_lines.append(line)
    if shared_lines:
        findings.append(finding(
            "warning", "chat-shared-boundary-token", path,
            f"in {len(shared_lines)} conversation(s) (first: line {shared_lines[0]}) a token is shared by the prompt "
            "and a reply (e.g. a reply starting with a newline merges with the header's newline); it is labelled, "
            "as transformers' assistant mask does. Strip leading newlines from replies if that is not wanted.",
            shared_lines[0],
        ))
    return lengths, findings, system


def render(tokenizer, messages: list[dict]) -> str:
    """The text the model sees: the tokenizer's chat template, or ``render_plain`` without a tokenizer."""
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        try:
            return render_template(tokenizer, messages)
        except DataError as exc:
            return f"(the chat template refuses this conversation: {exc.message})"
    return render_plain(messages)


def count_tokens(tokenizer, messages: list[dict]) -> int:
    if tokenizer is None:
        return approx_tokens(messages)
    return len(tokenizer(render(tokenizer, messages), add_special_tokens=False)["input_ids"])


def histogram(lengths: list[int], sequence_len: int) -> list[dict[str, Any]]:
    """Counts per power-of-two band, with sequence_len as one of the edges."""
    edges = sorted({0, *(2**k for k in range(5, 18)), sequence_len})
    top = max(lengths, default=0)
    edges = [e for e in edges if e <= max(top, sequence_len)] + [10**12]
    bins = []
    for lo, hi in itertools.pairwise(edges):
        n = sum(1 for x in lengths if lo <= x < hi)
        label = f"{lo}+" if hi == 10**12 else f"{lo}-{hi - 1}"
        if n or hi <= max(top, sequence_len):
            bins.append({"range": label, "count": n, "over_sequence_len": lo >= sequence_len})
    return bins


def _digest(messages: list[dict]) -> str:
    return hashlib.sha256(json.dumps(messages, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def check_chat(
    path: Path,
    *,
    model: Path | str | None = None,
    sequence_len: int = 2048,
    val: Path | None = None,
    fmt: str = "auto",
    system_prompt: str = "auto",
    max_line_bytes: int | None = None,
) -> Report:
    """All chat checks on one file (and its validation file): the report ``lorapod data check`` prints.

    With ``model`` every conversation is tokenised by that model's chat template exactly as the
    engine will (system prompt placement, reply masking), and what it refuses is reported by line.
    """
    path = Path(path)
    report = Report()
    try:
        numbered, findings, fmt = load_numbered(path, fmt, max_line_bytes=max_line_bytes, mixed=True)
        conversations = [c for _, c in numbered]
    except DataError as exc:  # no line in any format: one finding, no traceback
        report.add(finding("error", "chat-unusable", path, str(exc)))
        report.summary.update({"kind": "chat", "path": str(path), "usable": 0})
        return report
    if not conversations:
        report.extend(findings)
        report.add(finding("error", "chat-unusable", path,
                           "no usable example in this file; fix the problems listed for it."))
        report.summary.update({"kind": "chat", "path": str(path), "format": fmt, "usable": 0})
        return report
    report.extend(findings)
    report.summary.update({"kind": "chat", "path": str(path), "format": fmt, "usable": len(conversations)})
    report.add(finding("info", "chat-format", path, f"format: {fmt} ({len(conversations)} usable examples)."))

    digests = [_digest(c) for c in conversations]
    dupes = {d: n for d, n in Counter(digests).items() if n > 1}
    if dupes:
        extra = sum(n - 1 for n in dupes.values())
        report.add(finding("warning", "chat-duplicate", path,
                           f"{extra} examples are exact duplicates of others ({len(dupes)} distinct); "
                           "duplicates over-weight those answers: remove them."))
    report.summary["duplicates"] = sum(n - 1 for n in dupes.values())
    if len(conversations) < 100:
        report.add(finding("info", "chat-few-examples", path,
                           f"{len(conversations)} examples; 500-2000 is the usual range for a chat LoRA."))

    val_convs: list[list[dict]] = []
    if val is not None:
        try:
            val_convs, val_findings, val_fmt = load_conversations(Path(val), "auto")
        except DataError as exc:  # reported like the train file's problems, not as a crash
            report.add(finding("error", "chat-val-unusable", val, str(exc)))
            val = None
    if val is not None:
        report.extend(val_findings)
        shared = set(digests) & {_digest(c) for c in val_convs}
        report.summary["val"] = {"path": str(val), "format": val_fmt, "usable": len(val_convs),
                                 "shared_with_train": len(shared)}
        if shared:
            report.add(finding("warning", "chat-val-leak", val,
                               f"{len(shared)} validation examples also appear in {path.name}; validation loss "
                               "would be flattering: remove them from one of the files."))

    tokenizer = load_tokenizer(model) if model is not None else None
    example = conversations[0]
    if tokenizer is None:
        lengths = [count_tokens(None, c) for c in conversations]
    else:
        if ensure_chat_template(tokenizer):
            report.add(finding("warning", "chat-no-template", str(model),
                               "the tokenizer has no chat template; lorapod trains with its ChatML fallback "
                               "(lengths are counted on it). Use an instruct model or give the template."))
        lengths, template_findings, system = template_check(tokenizer, numbered, path, system_prompt)
        report.extend(template_findings)
        if not lengths:
            report.add(finding("error", "chat-unusable", path,
                               "the model's chat template refuses every example; see the errors above."))
            report.summary["usable"] = 0
            return report
        report.summary["usable"] = len(lengths)
        if system is not None and not system.refused:
            example = place_system(example, system)
    truncated = sum(1 for n in lengths if n > sequence_len)
    ordered = sorted(lengths)
    report.summary["tokens"] = {
        "method": f"tokenizer:{model}" if tokenizer is not None else "approximation (chars/4)",
        "sequence_len": sequence_len,
        "min": ordered[0],
        "median": ordered[len(ordered) // 2],
        "p95": ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)],
        "max": ordered[-1],
        "truncated": truncated,
        "histogram": histogram(lengths, sequence_len),
    }
    if truncated:
        report.add(finding("warning", "chat-truncated", path,
                           f"{truncated} of {len(lengths)} examples are longer than sequence_len={sequence_len} "
                           f"tokens (longest {ordered[-1]}) and would be cut; raise sequence_len or shorten them."))
    report.summary["example_rendered"] = render(tokenizer, example)
    return report
