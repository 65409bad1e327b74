"""``--help`` as click has always printed it, whatever typer renders by default.

typer 0.2x prints every option's Python type as its metavar (``--debug <bool>``, ``--set
<list[str]>``, ``--nodes <int range>``), a required argument as ``{job}``, and keeps a docstring's
single line breaks in the command list, so a summary breaks off mid-sentence ("the job's log," /
"live from the instance"). :class:`LorapodGroup`, the root group, walks every command once when it
is built and puts back click's spelling: no metavar on a flag, ``TEXT`` / ``INTEGER`` / ``PATH`` /
``[a|b]`` on an option, ``JOB`` / ``[SPEC]`` for arguments, and each paragraph of help on one line
for the terminal to wrap. Older typer (which already printed click's metavars) is left as it is.
"""

from __future__ import annotations

import inspect
from typing import Any

from typer.core import TyperGroup

_NAMES = {"str": "TEXT", "int": "INTEGER", "float": "FLOAT", "path": "PATH", "file": "FILE",
          "directory": "DIRECTORY", "int range": "INTEGER", "float range": "FLOAT", "bool": ""}


def _label(typed: str) -> str:
    inner = typed.strip("<>")
    if inner.startswith("list[") and inner.endswith("]"):
        inner = inner[5:-1]  # a repeatable option: each use takes one value
    if inner in _NAMES:
        return _NAMES[inner]
    return f"[{inner}]" if "|" in inner else inner.upper()


def _param(p: Any) -> None:
    if not hasattr(p, "display_type"):  # older typer: click's own metavars already
        return
    try:
        label = "" if getattr(p, "is_flag", False) else _label(str(p.display_type(None)))
    except Exception:  # a type typer cannot name without a context: leave it as typer shows it
        return
    if p.param_type_name == "argument":
        name = (p.metavar or p.name or "").upper()
        p.metavar = name
        p.display_type_rich = lambda ctx, _t=label: _t
        p._usage_display_name = lambda _n=name, _req=p.required, _many=p.nargs != 1: \
            (_n if _req else f"[{_n}]") + ("..." if _many else "")
    elif p.metavar is None:
        p.metavar = label


def _paragraphs(text: str | None) -> str | None:
    if not text:
        return text
    parts = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(p if p.startswith("\b") else " ".join(ln.strip() for ln in p.splitlines()) for p in parts)


def _command(cmd: Any) -> None:
    cmd.help = _paragraphs(cmd.help)
    if getattr(cmd, "short_help", None):
        cmd.short_help = _paragraphs(cmd.short_help)
    for p in cmd.params:
        _param(p)
    original = cmd.get_help_option

    def get_help_option(ctx: Any, _original: Any = original) -> Any:
        opt = _original(ctx)
        if opt is not None:
            _param(opt)
        return opt

    cmd.get_help_option = get_help_option
    for sub in (getattr(cmd, "commands", None) or {}).values():
        _command(sub)


class LorapodGroup(TyperGroup):
    """The root ``lorapod`` group: its whole command tree in click's help spelling (see above)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _command(self)


def renew_option_help(command: Any, param: str, text: str) -> None:
    """Set the help of ``command``'s option ``param`` when the command is registered (``build_app``),
    not when its module was first imported: help that names the registered trainers then names one
    a plugin registered in between too (typer reads each option's help from its ``OptionInfo``, the
    parameter's default)."""
    inspect.signature(command).parameters[param].default.help = text
