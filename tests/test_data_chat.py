"""Chat JSONL: the shared parser (formats, normalisation, per-line findings) and check_chat."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lorapod.data.chat import (
    approx_tokens,
    check_chat,
    detect_format,
    load_conversations,
    read_jsonl,
    to_messages,
    validate_messages,
)
from lorapod.errors import DataError, ModelLoadError


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("LORAPOD_HOME", str(tmp_path / "home"))


def write_lines(path: Path, lines: list) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def msg(user: str = "hi", answer: str = "hello", system: str | None = None) -> dict:
    turns = [{"role": "system", "content": system}] if system else []
    return {"messages": [*turns, {"role": "user", "content": user}, {"role": "assistant", "content": answer}]}


def codes(findings) -> list[tuple[str, int | None]]:
    return [(f.code, f.line) for f in findings]


def test_detect_each_format():
    assert detect_format([(1, msg())]) == "messages"
    assert detect_format([(1, {"conversations": [{"from": "human", "value": "x"}]})]) == "sharegpt"
    assert detect_format([(1, {"instruction": "a", "input": "", "output": "b"})]) == "alpaca"
    # LLaMA-Factory writes ShareGPT speakers under "messages": still ShareGPT, not messages.
    assert detect_format([(1, {"messages": [{"from": "human", "value": "x"}]})]) == "sharegpt"


def test_mixed_file_refused_with_line_number():
    records = [(1, msg()), (2, msg()), (3, {"instruction": "a", "output": "b"})]
    with pytest.raises(DataError, match="line 1 is messages but line 3 is alpaca"):
        detect_format(records)


def test_nothing_recognisable():
    with pytest.raises(DataError, match="no line looks like a chat example"):
        detect_format([(1, {"text": "x"})])


def test_sharegpt_roles_mapped_and_system_kept():
    rec = {"conversations": [
        {"from": "system", "value": "be brief"},
        {"from": "human", "value": "q"},
        {"from": "gpt", "value": "a"},
    ]}
    assert to_messages(rec, "sharegpt") == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
    ]


def test_alpaca_joins_instruction_and_input():
    out = to_messages({"instruction": "Translate", "input": "hola", "output": "hello"}, "alpaca")
    assert out == [{"role": "user", "content": "Translate\n\nhola"}, {"role": "assistant", "content": "hello"}]
    out = to_messages({"instruction": "Say hi", "input": "", "output": "hi", "system": "S"}, "alpaca")
    assert out[0] == {"role": "system", "content": "S"} and out[1]["content"] == "Say hi"


def test_openai_content_parts_joined():
    rec = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                        {"role": "assistant", "content": "c"}]}
    assert to_messages(rec, "messages")[0]["content"] == "ab"
    with pytest.raises(DataError, match="must be a string"):
        to_messages({"messages": [{"role": "user", "content": 5}]}, "messages")


def test_read_jsonl_bad_lines_become_findings(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_bytes(
        json.dumps(msg()).encode() + b"\n"
        + b"{not json}\n"
        + b"\n"
        + b"[1, 2]\n"
        + b'{"messages": "\xff\xfe"}\n'
        + json.dumps(msg("x")).encode() + b"\n"
        + b'{"messages": [{"role": "user", "con'
    )
    records, findings = read_jsonl(p)
    assert [line for line, _ in records] == [1, 6]
    assert codes(findings) == [
        ("chat-bad-json", 2), ("chat-not-object", 4), ("chat-not-utf8", 5), ("chat-truncated-line", 7),
    ]
    assert all(f.path == str(p) for f in findings)


def test_read_jsonl_missing_and_array(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        read_jsonl(tmp_path / "nope.jsonl")
    with pytest.raises(DataError, match="is a folder"):
        read_jsonl(tmp_path)
    p = tmp_path / "a.json"
    p.write_text(json.dumps([msg(), msg()]))
    records, findings = read_jsonl(p)
    assert records == [] and findings[0].code == "chat-json-array"


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        ([], "chat-empty-conversation"),
        ([{"role": "user", "content": "q"}, {"role": "bot", "content": "a"}], "chat-unknown-role"),
        ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "  "}], "chat-empty-content"),
        ([{"role": "user", "content": "q"}, {"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}],
         "chat-system-not-first"),
        ([{"role": "user", "content": "q"}], "chat-no-assistant"),
        ([{"role": "user", "content": "q"}, {"role": "user", "content": "q2"}, {"role": "assistant", "content": "a"}],
         "chat-consecutive-roles"),
    ],
)
def test_validate_messages_errors(messages, expected):
    found = validate_messages(messages, 7, "f.jsonl")
    assert expected in [f.code for f in found if f.severity == "error"]
    assert all(f.line == 7 and f.path == "f.jsonl" for f in found)


def test_validate_clean_conversation_has_no_findings():
    assert validate_messages(to_messages(msg(system="s"), "messages"), 1) == []


def test_load_conversations_keeps_only_usable(tmp_path):
    p = write_lines(tmp_path / "c.jsonl", [
        msg(),
        {"messages": [{"role": "user", "content": "only a question"}]},
        {"text": "not chat"},
        msg("second"),
    ])
    convs, findings, fmt = load_conversations(p)
    assert fmt == "messages" and len(convs) == 2
    assert ("chat-no-assistant", 2) in codes(findings)
    assert ("chat-missing-keys", 3) in codes(findings)


def test_load_conversations_zero_usable_raises(tmp_path):
    p = write_lines(tmp_path / "c.jsonl", [{"messages": [{"role": "user", "content": "q"}]}])
    with pytest.raises(DataError, match=r"no usable chat example.*line 1"):
        load_conversations(p)
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    with pytest.raises(DataError, match="empty"):
        load_conversations(empty)


def test_load_conversations_mixed_raises(tmp_path):
    p = write_lines(tmp_path / "c.jsonl", [msg(), {"conversations": [{"from": "human", "value": "x"}]}])
    with pytest.raises(DataError, match="line 2 is sharegpt"):
        load_conversations(p)


def test_explicit_format_mismatch_is_per_line(tmp_path):
    p = write_lines(tmp_path / "c.jsonl", [msg(), {"instruction": "a", "output": "b"}])
    convs, findings, fmt = load_conversations(p, "alpaca")
    assert fmt == "alpaca" and len(convs) == 1
    assert ("chat-missing-keys", 1) in codes(findings)


def test_approx_tokens_counts_cjk_per_char():
    ascii_only = approx_tokens([{"role": "user", "content": "a" * 40}])
    cjk = approx_tokens([{"role": "user", "content": "字" * 40}])
    assert ascii_only == 10 + 4 and cjk == 40 + 4


def test_check_chat_duplicates_val_leak_truncation(tmp_path):
    long = "word " * 400  # ~500 approximate tokens
    train = write_lines(tmp_path / "train.jsonl", [msg("a"), msg("a"), msg("b"), msg(long)])
    val = write_lines(tmp_path / "val.jsonl", [msg("b"), msg("c")])
    report = check_chat(train, sequence_len=128, val=val)
    by_code = {f.code: f for f in report.findings}
    assert "1 examples are exact duplicates" in by_code["chat-duplicate"].message
    assert "1 validation examples" in by_code["chat-val-leak"].message
    assert "1 of 4 examples" in by_code["chat-truncated"].message
    tokens = report.summary["tokens"]
    assert tokens["truncated"] == 1 and tokens["method"].startswith("approximation")
    assert sum(b["count"] for b in tokens["histogram"]) == 4
    assert any(b["over_sequence_len"] and b["count"] == 1 for b in tokens["histogram"])
    assert report.summary["format"] == "messages"
    assert not report.has_errors
    assert "<|user|>" in report.summary["example_rendered"]
    # the JSON shape the CLI prints
    d = report.to_dict()
    assert set(d) == {"findings", "summary"}
    assert set(d["findings"][0]) == {"severity", "code", "path", "line", "message"}
    json.dumps(d)


def test_check_chat_mixed_is_a_finding_not_a_crash(tmp_path):
    p = write_lines(tmp_path / "c.jsonl", [msg(), {"instruction": "a", "output": "b"}])
    report = check_chat(p)
    assert report.has_errors and report.findings[0].code == "chat-mixed-format"


def tiny_tokenizer(folder: Path, template: bool = True) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2}
    for w in ["hello", "world", "how", "are", "you", "fine", "thanks", "user", "assistant", "system"]:
        vocab[w] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", bos_token="<s>", eos_token="</s>")
    if template:
        fast.chat_template = "{% for m in messages %}<s>{{ m.role }} {{ m.content }}</s>{% endfor %}"
    fast.save_pretrained(folder)
    return folder


def test_check_chat_with_model_tokenizer(tmp_path):
    model = tiny_tokenizer(tmp_path / "model")
    p = write_lines(tmp_path / "c.jsonl", [msg("hello world", "fine thanks"), msg("how are you " * 5, "fine")])
    report = check_chat(p, model=model, sequence_len=16)
    tokens = report.summary["tokens"]
    # "<s>user hello world</s><s>assistant fine thanks</s>" = 10 tokens with this vocabulary
    assert tokens["min"] == 10 and tokens["truncated"] == 1
    assert tokens["method"] == f"tokenizer:{model}"
    assert report.summary["example_rendered"] == "<s>user hello world</s><s>assistant fine thanks</s>"


def test_check_chat_tokenizer_without_template_warns(tmp_path):
    model = tiny_tokenizer(tmp_path / "model", template=False)
    p = write_lines(tmp_path / "c.jsonl", [msg("hello", "fine")])
    report = check_chat(p, model=model)
    assert "chat-no-template" in [f.code for f in report.findings]


def test_check_chat_bad_model_dir(tmp_path):
    p = write_lines(tmp_path / "c.jsonl", [msg()])
    with pytest.raises(ModelLoadError, match="not a model folder"):
        check_chat(p, model=tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="cannot load a tokenizer"):
        check_chat(p, model=tmp_path / "empty")


def test_parser_import_is_light():
    """The engine imports this parser; it must not drag in torch, transformers or Pillow."""
    import subprocess
    import sys

    code = ("import sys, lorapod.data.chat, lorapod.cli.data; "
            "print(sorted(m for m in ('torch', 'transformers', 'PIL') if m in sys.modules))")
    src = str(Path(__file__).resolve().parents[1] / "src")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin"}).stdout.strip()
    assert out == "[]"


def test_giant_line_is_skipped_not_read_whole(tmp_path, monkeypatch):
    import lorapod.data.chat as chat

    monkeypatch.setattr(chat, "MAX_LINE_BYTES", 1024)
    p = tmp_path / "c.jsonl"
    p.write_bytes(json.dumps(msg()).encode() + b"\n" + b"x" * 5000 + b"\n" + json.dumps(msg("2")).encode() + b"\n")
    records, findings = read_jsonl(p)
    assert [line for line, _ in records] == [1, 3]
    assert codes(findings) == [("chat-line-too-long", 2)]


def test_unusable_val_file_is_a_finding(tmp_path):
    train = write_lines(tmp_path / "train.jsonl", [msg("a")])
    val = write_lines(tmp_path / "val.jsonl", [msg("b"), {"instruction": "x", "output": "y"}])
    report = check_chat(train, val=val)
    assert [f.code for f in report.findings if f.severity == "error"] == ["chat-val-unusable"]
    assert any("line 2 is alpaca" in f.message for f in report.findings)


def test_a_50_mb_line_is_a_finding_in_well_under_a_second_with_bounded_memory(tmp_path):
    """Issue 22 item 7: one 50 MB line used to keep `data check --model` busy for minutes at
    9.5 GB (read whole, parsed, rendered and tokenised). Now it is reported unread, the rest of
    the file is checked, and memory stays near the per-line cap."""
    import time
    import tracemalloc

    model = tiny_tokenizer(tmp_path / "model")
    p = tmp_path / "c.jsonl"
    with open(p, "wb") as fh:
        fh.write(json.dumps(msg("hello world", "fine")).encode() + b"\n")
        fh.write(b'{"messages": [{"role": "user", "content": "' + b"x" * (50 << 20) + b'"}]}\n')
        fh.write(json.dumps(msg("how are you", "fine")).encode() + b"\n")
    check_chat(write_lines(tmp_path / "warm.jsonl", [msg()]), model=model)  # imports and caches out of the way
    tracemalloc.start()
    t0 = time.perf_counter()
    report = check_chat(p, model=model)
    took = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert [(f.code, f.line) for f in report.findings if f.severity == "error"] == [("chat-line-too-long", 2)]
    assert report.summary["usable"] == 2
    assert took < 1.0, took
    assert peak < 32 << 20, peak  # a few 4 MiB chunks at most: never the 50 MB line


def test_the_line_cap_is_settable(tmp_path):
    p = write_lines(tmp_path / "c.jsonl", [msg("a" * 5000)])
    assert codes(read_jsonl(p, max_line_bytes=1024)[1]) == [("chat-line-too-long", 1)]
    assert read_jsonl(p)[1] == []
