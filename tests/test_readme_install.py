"""README's first command as a new user runs it (issue 38, item 1): torch comes from PyTorch's CPU
index (on Linux, PyPI's torch is the CUDA build: a 527 MB wheel plus ~2.2 GB of CUDA libraries),
the two-command promise holds, and the install's size and time are stated apart from the demo's.

The pip commands are read with pip's own option parser, so a flag pip would not apply to the
torch install (a typo, a flag on the other command) fails here."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _first_block() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block, "README has no bash block"
    return block[1].splitlines()


def _commands(lines: list[str]) -> list[list[str]]:
    """The shell commands of the block (comments and blank lines out), each split at && into argv lists."""
    out = []
    for line in lines:
        if line.strip() and not line.lstrip().startswith("#"):
            out.append([shlex.split(part) for part in line.split("&&")])
    return out


def _pip_installs(parts: list[list[str]]):
    pip_internal = pytest.importorskip("pip._internal.commands", reason="pip's own parser reads the commands")
    for argv in parts:
        if argv[:2] == ["pip", "install"] or argv[1:4] == ["-m", "pip", "install"]:
            args = argv[2:] if argv[0] == "pip" else argv[4:]
            opts, reqs = pip_internal.create_command("install").parse_args(args)
            yield opts, reqs


def test_the_first_command_installs_torch_from_pytorchs_cpu_index():
    lines = _first_block()
    commands = _commands(lines)
    first = commands[0]
    assert first[-1] == ["lorapod", "demo"], "command 1 ends with the demo"
    installs = list(_pip_installs(first))
    torch = [(o, r) for o, r in installs if any(q.startswith("torch") for q in r)]
    assert len(torch) == 1, installs
    opts, reqs = torch[0]
    assert CPU_INDEX in [opts.index_url, *opts.extra_index_urls], "torch must come from PyTorch's CPU index"
    assert opts.index_url == CPU_INDEX, "--index-url: PyPI's CUDA torch is never considered"
    pin = next(q for q in reqs if q.startswith("torch"))
    assert re.fullmatch(r"torch==\d+\.\d+\.\d+", pin)
    # the CPU index serves torch and its own dependencies only: lorapod's extras come from PyPI,
    # in a command of their own
    assert reqs == [pin] and any("-e" in argv for argv in first)
    ci = (ROOT / ".ci" / "run").read_text()
    assert f'"{pin}"' in ci, "README and CI pin the same torch"


def test_two_commands_and_the_install_stated_apart_from_the_demo():
    lines = _first_block()
    numbered = [line for line in lines if re.match(r"# \d\. ", line)]
    assert [n[:4] for n in numbered] == ["# 1.", "# 2."]
    first_comment = " ".join(line.lstrip("# ").strip() for line in lines[:lines.index(numbered[1])]
                             if line.startswith("#"))
    install = re.search(r"Install: (.*?)Demo:", first_comment)
    demo = re.search(r"Demo: (.*)", first_comment)
    assert install and demo, first_comment
    assert re.search(r"\d+ MB downloaded", install[1]) and re.search(r"[\d.]+ GB\s+on disk|[\d.]+ GB on disk", install[1])
    assert re.search(r"[\d.]+ min measured", install[1]) and re.search(r"\d+ s measured", demo[1])
    readme = (ROOT / "README.md").read_text()
    assert "pins the CPU build" not in readme  # a pin alone never picked the CPU build from PyPI
