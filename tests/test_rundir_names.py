"""The run folder's names live in one place (rundir/layout.py, issue 34 item 3): no module outside
``rundir/`` spells the metrics file, the stop request or the checkpoint naming itself, and the
names parse back."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from lorapod.rundir import layout

SRC = Path(__file__).resolve().parents[1] / "src" / "lorapod"

#: A string literal that spells a run-folder name as a path or a name to build or parse: the metrics
#: file (``"metrics.jsonl"``, ``"run/metrics.jsonl"``), the stop request (``"STOP"``, ``"run/STOP"``,
#: ``'STOP'`` inside a script's text), a checkpoint (``"step-"`` or ``"epoch-"`` before a number, a
#: glob, a regex or an f-string's value, and a regex's ``(step|epoch)-``), the checkpoints folder
#: (``"checkpoints"``, ``"checkpoints/"``, ``"run/checkpoints"``) and the any-checkpoint glob
#: ``"*-*"`` that stands in for ``layout.has_checkpoints``. Prose such as "metrics go to
#: metrics.jsonl only", "STOP written" or "three checkpoints" is not.
SPELLED = {
    "metrics.jsonl": re.compile(r"^metrics\.jsonl$|/metrics\.jsonl\b"),
    "STOP": re.compile(r"^STOP$|/STOP\b|'STOP'"),
    "step-N": re.compile(r"\b(step|epoch)-(?=$|\d|\*|\(|\\d|\[|\{)|\((step|epoch)\|(step|epoch)\)-"),
    "checkpoints/": re.compile(r"(^|/)checkpoints/|/checkpoints$"),
    "*-* glob": re.compile(r"^\*-\*$"),
}

#: module (relative to src/lorapod) -> why it spells the names itself
ALLOWED = {
    "compute/watchdog.py": "uploaded to the instance and run there with the standard library only, so it "
                           "cannot import rundir; test_the_watchdog_spells_the_same_names checks its names",
}


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _folder_uses(tree: ast.AST) -> set[int]:
    """The bare ``"checkpoints"`` literals used as a folder: a path joined with ``/``, a call's
    argument (``Path(...)``, ``os.path.join``), an element of a tuple, list or set of names, a side
    of a comparison (``path.parent.name == "checkpoints"``). A dict
    key or a keyword's value (a JSON field, a plot's label) is not one."""
    out = set()
    for node in ast.walk(tree):
        kids: list[ast.AST] = []
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            kids = [node.left, node.right]
        elif isinstance(node, ast.Call):
            kids = list(node.args)
        elif isinstance(node, ast.Tuple | ast.List | ast.Set):
            kids = list(node.elts)
        elif isinstance(node, ast.Compare):  # path.parent.name == "checkpoints"
            kids = [node.left, *node.comparators]
        out |= {id(k) for k in kids if isinstance(k, ast.Constant) and k.value == CHECKPOINTS_WORD}
    return out


CHECKPOINTS_WORD = "checkpoints"


def spelled(path: Path) -> list[tuple[int, str, str]]:
    """(line, which name, the literal) for each string literal in ``path`` that spells a name."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs, folders = _docstrings(tree), _folder_uses(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            found += [(node.lineno, name, node.value[:80]) for name, rx in SPELLED.items() if rx.search(node.value)]
            if id(node) in folders:
                found.append((node.lineno, "checkpoints/", node.value))
    return sorted(found)


def test_no_module_outside_rundir_spells_the_run_folders_names():
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith("rundir/") or rel in ALLOWED:
            continue
        bad += [f"{rel}:{line}: {name} in {text!r}" for line, name, text in spelled(path)]
    assert not bad, "use lorapod.rundir.layout (METRICS, STOP, checkpoint_name/checkpoint_step):\n" + "\n".join(bad)
    for rel in ALLOWED:  # the allow-list only shrinks: an entry that no longer spells a name goes
        assert spelled(SRC / rel), f"{rel} no longer spells a run-folder name: take it off ALLOWED"


def test_the_check_sees_what_it_is_meant_to(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('"""metrics.jsonl and STOP in a docstring are prose."""\n'
                     'a = root / "metrics.jsonl"\nb = f"run/STOP"\nc = f"step-{n}"\nd = glob("step-*")\n'
                     'e = "metrics go to metrics.jsonl only; STOP written; step-distilled; three checkpoints"\n'
                     'f = root / "checkpoints"\ng = f"{x}/checkpoints/"\nh = re.compile(r"checkpoints/(step|epoch)-")\n'
                     'i = c.glob("*-*")\nj = f"epoch-{n}"\nk = {"checkpoints": 3}\nplot(label="checkpoints")\n'
                     'for sub in ("checkpoints", "samples"): pass\nif p.name == "checkpoints": pass\n')
    assert [(line, name) for line, name, _ in spelled(probe)] == [
        (2, "metrics.jsonl"), (3, "STOP"), (4, "step-N"), (5, "step-N"), (7, "checkpoints/"), (8, "checkpoints/"),
        (9, "checkpoints/"), (9, "step-N"), (10, "*-* glob"), (11, "step-N"), (14, "checkpoints/"),
        (15, "checkpoints/")]


def test_the_watchdog_spells_the_same_names():
    text = (SRC / "compute" / "watchdog.py").read_text(encoding="utf-8")
    assert f'"{layout.METRICS}"' in text and f'"{layout.STOP}"' in text


def test_checkpoint_and_sample_names_parse_back(tmp_path):
    assert layout.checkpoint_name(120) == "step-120" and layout.checkpoint_step("step-120") == 120
    assert [layout.checkpoint_step(n) for n in ("step-", "step-x", "epoch-2", "step-1/..", "step-01x")] == [None] * 5
    assert layout.sample_step(layout.sample_file(layout.sample_tag(40), 1, ".png")) == (40, 1)
    assert layout.sample_step("step000040-grid.png") is None
    assert layout.sample_parts("step000040-grid.png") == ("step000040", "grid")
    folder = tmp_path / "checkpoints"
    for n in (2, 30, 4):
        (folder / layout.checkpoint_name(n)).mkdir(parents=True)
    (folder / "step-999").symlink_to(tmp_path)  # planted: never a checkpoint
    (folder / "notes").mkdir()
    assert [s for s, _ in layout.checkpoints_by_step(folder)] == [2, 4, 30]
