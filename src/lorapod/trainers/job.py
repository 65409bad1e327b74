"""The job a trainer adapter produces, as plain data: files, setup and train commands, notes.

An adapter turns a :class:`~lorapod.spec.JobSpec` into a :class:`TrainerJob` (the config YAML,
dataset TOML and prompt files to write, the setup commands, the commands that train, the notes on
spec settings that have no effect), so ``lorapod train --print`` shows exactly what ``lorapod
run`` will execute. It sits below both the adapters' base class (``trainers/base.py``) and the
contract checker (``trainers/contracts/``), which each need it and which the base class calls.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml

from lorapod.errors import SpecError

Phase = Literal["setup", "prepare", "train", "post"]


class TrainerRefused(SpecError):
    """The spec asks for something the chosen trainer cannot do; nothing was rented."""


@dataclass
class Command:
    """One command line. ``script`` names the contract entry its options are checked against."""

    name: str
    argv: list[str]
    phase: Phase = "train"
    cwd: str | None = None
    script: str | None = None
    shell: bool = False  # argv[0] is a shell snippet (setup only: `cd x && git ...`)

    def render(self) -> str:
        cmd = self.argv[0] if self.shell else " ".join(shell_quote(a) for a in self.argv)
        return f"(cd {shell_quote(self.cwd)} && {cmd})" if self.cwd else cmd


WORK = "$WORK"  # the printed job's work folder (``lorapod train --print``), a shell variable
# Defines $WORK for a pasted --print, or stops with what to set: the folder lorapod run makes on
# the instance, holding the spec and data/ (trainer-run's --work default is the spec's folder).
WORK_GUARD = ': "${WORK:?set WORK to the job folder: the one holding the spec and data/}"'


def shell_quote(arg: str) -> str:
    """``shlex.quote``, except that ``$WORK`` stays a variable the shell expands (double quotes,
    everything else in them escaped), so a printed command pasted into a shell finds its files."""
    if WORK not in arg:
        return shlex.quote(arg)
    parts = [re.sub(r'([\\"`$])', r"\\\1", part) for part in arg.split(WORK)]
    return '"' + WORK.join(parts) + '"'


@dataclass
class TrainerJob:
    trainer: str
    files: dict[str, str]
    setup: list[Command]
    commands: list[Command]
    output_dir: str
    output_name: str
    notes: list[str] = field(default_factory=list)
    config: dict[str, Any] | None = None  # the YAML config (ai-toolkit, axolotl), for checks and import
    # a resumed kohya job: the trainer counts its steps (bar, file names) from 0 again, so its step
    # n is step n + step_offset of the run, and its bar's total is total_offset short
    step_offset: int = 0
    total_offset: int = 0

    def train_command(self) -> Command:
        """The command that trains (the last of phase ``train``: a ``post`` step may follow it)."""
        return next(c for c in reversed(self.commands) if c.phase == "train")

    def relocate(self, paths: dict[str, str]) -> None:
        """Rewrite local paths (the data folders the job was built from) to where they will be on
        the instance, in files, command lines and the config, and nothing else: the job keeps the
        shape its real data gave it (clips or stills, the image count, the refusals)."""
        import json

        def swap(text: str) -> str:
            for old, new in sorted(paths.items(), key=lambda kv: -len(kv[0])):
                if text == old or text.startswith(old.rstrip("/") + "/"):
                    return new + text[len(old.rstrip("/")):] if text != old else new
            return text

        def walk(x: Any) -> Any:
            if isinstance(x, dict):
                return {k: walk(v) for k, v in x.items()}
            if isinstance(x, list):
                return [walk(v) for v in x]
            return swap(x) if isinstance(x, str) else x

        for cmd in [*self.setup, *self.commands]:
            cmd.argv = [swap(a) for a in cmd.argv]
        if self.config is not None:
            self.config = walk(self.config)
        for path, text in list(self.files.items()):
            if self.config is not None and path.endswith((".yaml", ".yml")):
                self.files[path] = dump_yaml(self.config)
                continue
            for old, new in paths.items():  # TOML strings are JSON strings (tomlw.value): whole, or a prefix
                text = text.replace(json.dumps(old), json.dumps(new))
                text = text.replace(json.dumps(old.rstrip("/") + "/")[:-1], json.dumps(new.rstrip("/") + "/")[:-1])
            self.files[path] = text

    def render(self) -> str:
        """The files and commands as a person reads them (``lorapod train --print``)."""
        out = [f"# trainer: {self.trainer}"]
        for path, text in self.files.items():
            out += [f"# ---- file {path}", text.rstrip("\n")]
        for title, cmds in (("setup", self.setup), ("run", self.commands)):
            out.append(f"# ---- {title}")
            if title == "setup" and any(WORK in a for c in [*self.setup, *self.commands] for a in c.argv):
                out.append(WORK_GUARD)
            out += [f"# {c.name}\n{c.render()}" for c in cmds]
        if self.notes:
            out.append("# ---- notes")
            out += [f"# - {n}" for n in self.notes]
        return "\n".join(out) + "\n"


def dump_yaml(cfg: dict[str, Any]) -> str:
    """A job's YAML config as it is written (ai-toolkit, axolotl): keys in the order built."""
    return yaml.safe_dump(cfg, sort_keys=False, default_flow_style=None, width=120)
