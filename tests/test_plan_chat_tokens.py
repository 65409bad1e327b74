"""``lorapod plan`` counts a chat file's tokens as training reads it (issue 38, item 3): one line
over the 4 MiB limit `data check` refuses is not counted, and an example longer than
``data.sequence_len`` counts as the ``sequence_len`` tokens training keeps of it."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

import lorapod.cli.main as cli_main
from lorapod.cli.main import build_app
from lorapod.data.chat import MAX_LINE_BYTES, approx_tokens

ROOT = Path(__file__).resolve().parents[1]
LLM = str(ROOT / "examples" / "llm-chat-lora.yaml")
SEQ = 512


@pytest.fixture(autouse=True)
def _isolate(tmp_path, monkeypatch):
    monkeypatch.setenv("LORAPOD_HOME", str(tmp_path / "home"))
    present = [c for c in cli_main.COMMANDS if importlib.util.find_spec(f"lorapod.cli.{c}")]
    monkeypatch.setattr(cli_main, "COMMANDS", present)


def _chat(user: str, reply: str) -> str:
    return json.dumps({"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]})


def _plan_tokens(*args: str) -> tuple[int, int, str]:
    r = CliRunner().invoke(build_app(), ["plan", LLM, *args])
    assert r.exit_code == 0, r.output
    said = " ".join(r.output.split())
    m = re.search(r"([\d,]+) examples, ([\d,]+) tokens", said)
    assert m, said
    return int(m[1].replace(",", "")), int(m[2].replace(",", "")), said


def test_one_huge_outlier_is_counted_as_training_reads_it(tmp_path):
    lines = [_chat(f"What colour is fruit number {i}?", f"Fruit number {i} is a pleasant shade of green. " * 3)
             for i in range(60)]
    lines.insert(20, _chat("Summarise this.", "word " * 8000))  # ~10,000 tokens: cut at SEQ by training
    lines.insert(30, _chat("And that.", "more " * 4000))
    lines.insert(40, _chat("And this?", "x" * (MAX_LINE_BYTES + 1000)))  # over the line limit: never read
    data = tmp_path / "chats.jsonl"
    data.write_text("\n".join(lines) + "\n")
    sets = ["--set", f"data.path={data}", "--set", f"data.sequence_len={SEQ}", "--set", "train.epochs=1"]
    examples, tokens, said = _plan_tokens(*sets)

    # training's own count: the engine's loader (same line limit, same seeded validation split),
    # each conversation cut at sequence_len as the tokenizer's ids are cut
    from lorapod.data.chat_split import load_split
    from lorapod.spec import load_spec

    engine = (ROOT / "src" / "lorapod" / "engine" / "llm.py").read_text()  # (importing it costs torch)
    assert "from lorapod.data.chat_split import Split, load_split" in engine and "def load_split" not in engine

    spec = load_spec(LLM, [f"data.path={data}", f"data.sequence_len={SEQ}", "train.epochs=1",
                           "data.skip_bad_examples=true"])
    split, _ = load_split(spec, log=lambda m: None)
    assert examples == len(split.train) + len(split.val) == 62
    assert tokens == sum(min(approx_tokens(c), SEQ) for c in split.train)
    cut = sum(1 for c in split.train if approx_tokens(c) >= SEQ)
    # the old count (every line's characters / 4) made the outlier the job: over a million tokens
    assert tokens < 5_000 and sum(len(x) for x in lines) // 4 > 1_000_000
    # the plan says why: the unread line stops training as it stands, and one example is cut
    assert "skipping 1 bad line(s)" in said and "data.skip_bad_examples" in said
    assert cut and f"{cut} training example(s) reach data.sequence_len={SEQ}" in said
    # and the steps follow the tokens: packed rows of SEQ tokens, micro-batches of 4
    assert f"-> 1 steps ({-(-tokens // (4 * SEQ))} micro-batches)" in said
