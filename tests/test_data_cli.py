"""`lorapod data ...` through the real entry point: exit status, --json purity, clean errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .cli_helpers import run_cli as run
from .datasets_util import good_folder, tree_digest

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("LORAPOD_HOME", str(tmp_path / "home"))


def test_data_is_listed_in_commands():
    src = (SRC / "lorapod" / "cli" / "main.py").read_text()
    assert '"data"' in src.split("COMMANDS = ", 1)[1].splitlines()[0]


def test_check_clean_folder_exits_zero(tmp_path, capsys):
    root = good_folder(tmp_path / "mug", n=15)
    code, out, _ = run(["data", "check", str(root), "--family", "sdxl", "--trigger", "zxq_mug"], capsys)
    assert code == 0, out
    assert "ready" in out and "1024x1024" in out


def test_check_json_is_pure_and_exit_one_on_errors(tmp_path, capsys):
    root = good_folder(tmp_path / "mug", n=15)
    (root / "img03.txt").unlink()
    code, out, _ = run(["data", "check", str(root), "--json"], capsys)
    assert code == 1
    doc = json.loads(out)
    assert set(doc) == {"findings", "summary"}
    missing = [f for f in doc["findings"] if f["code"] == "caption-missing"]
    assert missing == [{"severity": "error", "code": "caption-missing", "path": "img03.jpg", "line": None,
                        "message": missing[0]["message"]}]
    assert doc["summary"]["counts"]["error"] == 1


def test_check_chat_file(tmp_path, capsys):
    p = tmp_path / "chat.jsonl"
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    p.write_text(json.dumps(good) + "\n" + "{oops\n")
    code, out, _ = run(["data", "check", str(p), "--json", "--sequence-len", "64"], capsys)
    doc = json.loads(out)
    assert code == 1
    assert [(f["code"], f["line"]) for f in doc["findings"] if f["severity"] == "error"] == [("chat-bad-json", 2)]
    assert doc["summary"]["format"] == "messages" and doc["summary"]["tokens"]["sequence_len"] == 64
    code, out, _ = run(["data", "check", str(p), "--sequence-len", "64"], capsys)
    assert "as the model sees it" in out and "<|user|>" in out


def test_missing_path_is_a_clean_error(tmp_path, capsys):
    code, out, err = run(["data", "check", str(tmp_path / "nope")], capsys)
    assert code == 1 and "does not exist" in " ".join(err.split()) and "Traceback" not in err + out


def test_report_and_fix_commands(tmp_path, capsys, monkeypatch):
    root = good_folder(tmp_path / "mug", n=3, size=(256, 256))
    (root / "img00.txt").rename(root / "img00.TXT")
    monkeypatch.chdir(tmp_path)
    code, out, _ = run(["data", "report", str(root), "--family", "sd15"], capsys)
    assert code == 0 and (tmp_path / "mug-report.html").exists()
    code, out, _ = run(["data", "fix", str(root), "--out", str(tmp_path / "fixed"), "--trigger", "zxq_mug"], capsys)
    assert code == 0 and (tmp_path / "fixed" / "img00.txt").exists() and "renamed" in out
    code, _, err = run(["data", "fix", str(root)], capsys)
    assert code == 1 and "--in-place" in err


def test_subprocess_check_never_changes_files(tmp_path):
    root = good_folder(tmp_path / "mug", n=15)
    (root / "img02.txt").write_bytes(b"\x00\xff garbage")
    os.symlink("loop", root / "loop")
    before = tree_digest(root)
    env = {**os.environ, "PYTHONPATH": str(SRC), "LORAPOD_HOME": str(tmp_path / "home")}
    proc = subprocess.run([sys.executable, "-m", "lorapod", "data", "check", str(root), "--json"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    codes = {f["code"] for f in doc["findings"]}
    assert {"caption-binary", "symlink-loop"} <= codes
    assert "Traceback" not in proc.stderr
    assert tree_digest(root) == before
