"""The import layers of src/lorapod (docs/architecture.md), enforced on the source itself.

The graph is read with ``ast`` from every module under src/lorapod: module-level imports and the
lazy ones inside functions alike (a lazy import is still a dependency, only a later one), and
``if TYPE_CHECKING:`` imports too (a type is part of the contract). An edge is one module
importing another (``from pkg import mod`` is an edge to ``pkg.mod`` when that is a module, else to
``pkg``). A module may import its own layer or any layer below it, never one above, and no chain
of imports may come back to where it started.

What is still wrong is written down once, in ``ALLOWED``, each edge with why it is there and the
move that removes it. The list only shrinks: an allowed edge that is gone, or no longer upward
and on no circle, fails the test until it is taken off the list; any other upward edge or circle
fails it at once.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

# Bottom to top; a module belongs to the longest prefix that names it. ``lorapod`` alone is the
# root package (its __init__ holds only __version__). builtin/ (the tiny models and the
# ``lorapod:`` ids) and chat/ (templating and tokenisation) sit below data and the engine, which
# both use them (the review's M4 and chat moves); deploy/ (serving a trained model, issue 28) uses
# compute's provider APIs.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("lorapod", "lorapod.errors", "lorapod.fsutil", "lorapod.home"),
    ("lorapod.catalog",),
    ("lorapod.spec", "lorapod.prediction_type"),
    # store/: the controller's records (the ledger, who owns what); the planner reads measured runs
    # and boot times from it, compute writes them
    ("lorapod.tokenizer", "lorapod.rundir", "lorapod.builtin", "lorapod.chat", "lorapod.store"),
    # quality/: the autopilot's scoring and deciding, which the engine and the trainer runner call at
    # each checkpoint and export, evaluate, compute and the dashboard read
    ("lorapod.data", "lorapod.quality"),
    ("lorapod.plan",),
    # the two image LoRA file formats: the engine writes them at the end of training, export/
    # converts and re-writes them from checkpoints, and they import neither
    ("lorapod.engine", "lorapod.export.kohya", "lorapod.export.diffusers"),
    ("lorapod.trainers",),
    ("lorapod.export",),
    ("lorapod.evaluate",),
    ("lorapod.compute",),
    ("lorapod.deploy",),
    ("lorapod.demo", "lorapod.demo_image", "lorapod.demo_video"),
    ("lorapod.ui", "lorapod.cli", "lorapod.__main__"),
)

# (importer, imported) -> why it is still there, and the move that removes it.
ALLOWED: dict[tuple[str, str], str] = {}

Edges = Mapping[tuple[str, str], str]  # (importer, imported) -> "path:line" of the first such import


def modules(src: Path = SRC) -> dict[str, Path]:
    """Every module under src/lorapod by dotted name (a package by its own name)."""
    found = {}
    for path in sorted((src / "lorapod").rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports_of(source: str, name: str, is_package: bool, known: Iterable[str]) -> dict[str, int]:
    """The lorapod modules ``source`` (module ``name``) imports, anywhere in it, with the first line."""
    known = set(known)
    here = name.split(".") if is_package else name.split(".")[:-1]
    out: dict[str, int] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package this module is in, up level - 1
                up = here[: len(here) - (node.level - 1)]
                base = ".".join([*up, *([node.module] if node.module else [])])
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # lorapod.x.y.Name -> lorapod.x.y
                target = target.rpartition(".")[0]
            if target and target != name:
                out.setdefault(target, node.lineno)
    return out


def import_graph() -> dict[tuple[str, str], str]:
    """The tree's graph (a fresh copy of the one read once)."""
    return dict(_read_graph(SRC))


@cache
def _read_graph(src: Path) -> dict[tuple[str, str], str]:
    mods = modules(src)
    edges = {}
    for name, path in mods.items():
        rel = path.relative_to(src.parent)
        for target, line in imports_of(path.read_text(encoding="utf-8"), name, path.name == "__init__.py", mods).items():
            edges[(name, target)] = f"{rel}:{line}"
    return edges


def layer_of(module: str) -> int | None:
    best: tuple[int, int] | None = None
    for i, names in enumerate(LAYERS):
        for prefix in names:
            hit = module == prefix or (prefix != "lorapod" and module.startswith(prefix + "."))
            if hit and (best is None or len(prefix) > best[1]):
                best = (i, len(prefix))
    return None if best is None else best[0]


def circles(edges: Iterable[tuple[str, str]]) -> list[list[str]]:
    """The import circles: strongly connected groups of more than one module (Tarjan, iterative)."""
    graph: dict[str, list[str]] = {}
    for a, b in edges:
        graph.setdefault(a, []).append(b)
        graph.setdefault(b, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        group.append(m)
                        if m == node:
                            break
                    if len(group) > 1:
                        found.append(sorted(group))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def reaches(edges: Iterable[tuple[str, str]], start: str, goal: str) -> bool:
    graph: dict[str, list[str]] = {}
    for a, b in edges:
        graph.setdefault(a, []).append(b)
    seen, todo = {start}, [start]
    while todo:
        for nxt in graph.get(todo.pop(), []):
            if nxt == goal:
                return True
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return False


def upward(a: str, b: str) -> bool:
    la, lb = layer_of(a), layer_of(b)
    return la is not None and lb is not None and lb > la


def problems(edges: Edges, allowed: Mapping[tuple[str, str], str] = ALLOWED) -> list[str]:
    """Everything wrong with ``edges`` against LAYERS and ``allowed``, one readable line each."""
    out = []
    for module in sorted({m for edge in edges for m in edge}):
        if layer_of(module) is None:
            out.append(f"{module} is in no layer: add it to LAYERS in tests/test_architecture.py and to "
                       "docs/architecture.md")
    for edge in sorted(allowed):
        if edge not in edges:
            out.append(f"{edge[0]} no longer imports {edge[1]}: take it off ALLOWED (the list only shrinks)")
        elif not upward(*edge) and not reaches(edges, edge[1], edge[0]):
            out.append(f"{edge[0]} -> {edge[1]} ({edges[edge]}) is neither upward nor on a circle any more: "
                       "take it off ALLOWED")
    rest = {e: where for e, where in edges.items() if e not in allowed}
    for (a, b), where in sorted(rest.items()):
        if upward(a, b):
            out.append(f"{a} imports {b} ({where}): layer {layer_of(b)} is above layer {layer_of(a)}; "
                       "move the shared piece down (docs/architecture.md)")
    for group in circles(rest):
        inner = [f"{a} -> {b} ({where})" for (a, b), where in sorted(rest.items()) if a in group and b in group]
        out.append("import circle: " + "; ".join(inner))
    return out


# ----------------------------------------------------------------------------- the tree itself


def test_no_upward_import_and_no_circle_beyond_the_allow_list():
    assert problems(import_graph()) == []


def test_the_speed_model_its_fit_and_the_users_runs_meet_only_in_the_estimate():
    # plan/speed.py is the model; plan/fit.py fits it; plan/learned.py reads your runs; only
    # plan/estimate.py puts them together (docs/architecture.md, docs/planner.md)
    planner = {f"lorapod.plan.{m}" for m in ("speed", "fit", "learned", "estimate")}
    inside = sorted((a, b) for a, b in import_graph() if a in planner and b in planner)
    assert inside == [("lorapod.plan.estimate", "lorapod.plan.fit"), ("lorapod.plan.estimate", "lorapod.plan.learned"),
                      ("lorapod.plan.estimate", "lorapod.plan.speed"), ("lorapod.plan.fit", "lorapod.plan.speed"),
                      ("lorapod.plan.learned", "lorapod.plan.speed")]


def test_every_allowed_edge_says_why_and_what_removes_it():
    for edge, why in ALLOWED.items():
        assert "move" in why and len(why) > 40, edge


# ----------------------------------------------------------------------------- the checker fails


def test_the_catalog_importing_the_planner_again_fails():
    edges = {**import_graph(), ("lorapod.catalog.measurements", "lorapod.plan.vram"): "catalog/measurements.py:19"}
    (only,) = problems(edges)
    assert only.startswith("lorapod.catalog.measurements imports lorapod.plan.vram") and "layer 5 is above layer 1" in only


def test_a_circle_inside_one_layer_fails():
    # the speed model asking the fit for its parameters again: plan/speed -> plan/fit -> plan/speed
    edges = {**import_graph(), ("lorapod.plan.speed", "lorapod.plan.fit"): "plan/speed.py:1"}
    (only,) = problems(edges)
    assert only.startswith("import circle: ") and "lorapod.plan.speed -> lorapod.plan.fit" in only
    assert "lorapod.plan.fit -> lorapod.plan.speed" in only


def test_an_allowed_edge_that_is_gone_must_leave_the_list():
    # the engine's model loader imported the demo for the tiny built-in model until lorapod/builtin/
    gone = {**ALLOWED, ("lorapod.engine.llm_model", "lorapod.demo"): "the tiny models lived in demo.py; move: builtin/"}
    assert problems(import_graph(), gone) == ["lorapod.engine.llm_model no longer imports lorapod.demo: take it off ALLOWED "
                               "(the list only shrinks)"]


def test_an_allowed_circle_edge_no_longer_on_a_circle_must_leave_the_list():
    # images.py held the check_path dispatcher (images -> video) while video.py used images' helpers,
    # until data/check.py; here the helpers' edge is gone and the dispatcher's is still allowed
    dispatcher = ("lorapod.data.images", "lorapod.data.video")
    edges = {e: w for e, w in import_graph().items() if e != ("lorapod.data.video", "lorapod.data.images")}
    edges[dispatcher] = "src/lorapod/data/images.py:263"
    (only,) = problems(edges, {**ALLOWED, dispatcher: "check_path sat in images.py; move: it to data/check.py"})
    assert only.startswith("lorapod.data.images -> lorapod.data.video") and "neither upward nor on a circle" in only


def test_a_module_in_no_layer_fails():
    edges = {**import_graph(), ("lorapod.cli.main", "lorapod.newthing"): "cli/main.py:1"}
    assert problems(edges) == ["lorapod.newthing is in no layer: add it to LAYERS in tests/test_architecture.py "
                               "and to docs/architecture.md"]


@pytest.mark.parametrize(("source", "name", "is_package", "expected"), [
    # a lazy import inside a function is an edge like any other
    ("def f():\n    from lorapod.plan.fit import fitted\n", "lorapod.plan.speed", False, {"lorapod.plan.fit": 2}),
    # from a package, a submodule is an edge to the submodule, a name an edge to the package
    ("from lorapod.engine.diffusion import export, quiet\n", "lorapod.engine.diffusion.video", False,
     {"lorapod.engine.diffusion.export": 1, "lorapod.engine.diffusion": 1}),
    # relative imports resolve from the module's package; type-only imports count
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .learned import Match\n", "lorapod.plan.speed",
     False, {"lorapod.plan.learned": 3}),
    ("from . import fit\nimport lorapod\n", "lorapod.plan", True, {"lorapod.plan.fit": 1, "lorapod": 2}),
    ("import json, torch\n", "lorapod.plan.fit", False, {}),
])
def test_imports_are_read_wherever_they_are(source, name, is_package, expected):
    known = {"lorapod", "lorapod.plan", "lorapod.plan.fit", "lorapod.plan.learned", "lorapod.plan.speed",
             "lorapod.engine.diffusion", "lorapod.engine.diffusion.export", "lorapod.engine.diffusion.video"}
    assert imports_of(source, name, is_package, known) == expected


# ----------------------------------------------------------------------------- provider names

# Where a built-in provider's name (one with its own package, compute/<name>/) may be written
# outside that package, and why: the registry, or data about the provider. docs/architecture.md
# ("A new provider") points here; the stages, preflight, `down` and the planner's choice of which
# offers to price never read a name.
PROVIDER_NAMES_OUTSIDE: dict[str, str] = {
    "lorapod/compute/provider.py": "BUILTINS: the registry, one line per built-in",
    "lorapod/catalog/prices.py": "the snapshot's provider list and RunPod's network-volume price",
    "lorapod/catalog/images.py": "the default image per provider",
    "lorapod/compute/doctor.py": "SCOPED: the in-instance variables `lorapod doctor` looks for",
    "lorapod/plan/cost.py": "how each provider bills storage (catalog/data/storage.yaml is keyed by provider)",
    "lorapod/plan/storage.py": "RunPod's disk and network-volume prices in the storage advice",
    "lorapod/plan/volume.py": "RunPod's network-volume advice (and Vast.ai's note)",
    "lorapod/cli/plan.py": "prints that volume advice under each provider's name",
    "lorapod/cli/jobs.py": "ps lists RunPod serverless endpoints (deploy/ is RunPod-only today)",
    "lorapod/plan/spot.py": "how a preemption looks per provider (Vast.ai pauses, RunPod stops) in the spot model",
}


def provider_names_outside(src: Path = SRC) -> dict[str, int]:
    """Modules outside the providers' own packages with a string that is exactly a provider's name
    (any case), with the first line."""
    compute = src / "lorapod" / "compute"
    names = {d.name for d in compute.iterdir() if (d / "__init__.py").is_file()}
    out: dict[str, int] = {}
    for path in sorted((src / "lorapod").rglob("*.py")):
        rel = path.relative_to(src).as_posix()
        if any(rel.startswith(f"lorapod/compute/{n}/") for n in names):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.lower() in names:
                out.setdefault(rel, node.lineno)
    return out


def test_provider_names_appear_outside_their_packages_only_where_listed():
    found = provider_names_outside()
    unlisted = {f"{rel}:{line}" for rel, line in found.items() if rel not in PROVIDER_NAMES_OUTSIDE}
    assert not unlisted, f"a provider's name outside its package: {sorted(unlisted)}; move the decision into the " \
                         "provider (a trait, a capability, an optional interface) or list it here with why"
    stale = set(PROVIDER_NAMES_OUTSIDE) - set(found)
    assert not stale, f"no provider name left in {sorted(stale)}: take it off PROVIDER_NAMES_OUTSIDE"
    assert all(PROVIDER_NAMES_OUTSIDE.values())
