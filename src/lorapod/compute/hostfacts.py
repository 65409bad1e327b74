"""What a rented machine really has, asked over SSH in its first seconds: tools, Python, PID 1's PATH.

The images lorapod starts from are not built for lorapod, and an SSH session on them is not the
container's own environment:

* ``pytorch/pytorch`` (its ``Dockerfile``, stage ``official``) installs only ``ca-certificates
  libjpeg-dev libpng-dev``, keeps Python in ``/opt/conda/bin`` and puts it on PATH with ``ENV
  PATH /opt/conda/bin:$PATH``. Vast.ai documents that such image variables "are **not** visible
  inside SSH/tmux/Jupyter sessions by default", unless the image is one Vast publishes
  (vast-ai/docs ``guides/instances/docker-environment.mdx``). So ``python3`` over SSH may be
  missing, or be some other Python.
* ``runpod/base`` (runpod/containers ``official-templates/base/Dockerfile``) links ``python`` to
  Python 3.12 (``ln -sf /usr/bin/python3.12 /usr/local/bin/python``) and leaves ``python3`` the
  distribution's; the older ``runpod/pytorch:2.8.0-py3.11-...`` tags were built without rsync
  (``apt install ... git wget curl bash libgl1 software-properties-common openssh-server nginx``).
* The container's own variables (its PATH, ``RUNPOD_POD_ID``...) are in PID 1's environment;
  runpod-python reads them from there for its SSH sessions (``runpod/cli/utils/ssh_cmd.py``:
  ``while IFS= read -r -d '' line; do export "$line"; done < /proc/1/environ``).

So the interpreter is found the way the image has it: PID 1's PATH first, then the session's,
then places images are known to keep one; the first Python >= 3.11 that has torch wins (an image's
ML Python), else the first Python >= 3.11. Why it was chosen is said in words (:attr:`Choice.why`).

Everything the host prints is bounded and only lines with lorapod's own markers are read, so a
login banner or a chatty ``sitecustomize`` cannot confuse the probe.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from lorapod.errors import RemoteError

#: Where a Linux container keeps its init process's environment (proc(5): ``/proc/[pid]/environ``).
PID1_ENVIRON = "/proc/1/environ"
#: A host may say its "PID 1" environment lives elsewhere. Only lorapod's loopback test hosts set
#: it (a real container's PID 1 is its init); real instances never do, so the default applies.
PID1_SEAM = "LORAPOD_PID1_ENVIRON"
#: lorapod's engine needs Python >= 3.11 (pyproject ``requires-python``).
MIN_PYTHON = (3, 11)
#: Places images keep a Python that may be on no PATH an SSH session sees, each with its source.
KNOWN_PYTHONS: tuple[tuple[str, str], ...] = (
    ("/opt/conda/bin/python3", "pytorch/pytorch Dockerfile: Miniforge in /opt/conda"),
    ("/opt/conda/bin/python", "pytorch/pytorch Dockerfile: Miniforge in /opt/conda"),
    ("/usr/local/bin/python", "runpod/containers official-templates/base: python -> python3.12"),
    ("/usr/local/bin/python3", "docker-library/python: CPython built into /usr/local"),
    ("/usr/bin/python3", "the distribution's Python"),
)
#: Tools the bootstrap cares about: rsync moves files; tar is the fallback; the package managers
#: install rsync when the host lets us (root).
TOOLS = ("rsync", "tar", "apt-get", "yum", "dnf", "sha256sum", "setsid", "nohup")

_MAX_LINE = 4096
_MAX_LINES = 200


def _marked(stdout: bytes, marker: str) -> list[str]:
    """Lines that start with ``marker`` (a banner before them is ignored), bounded in number and length."""
    out = []
    for raw in stdout.splitlines()[: _MAX_LINES * 4]:
        line = raw[:_MAX_LINE].decode(errors="replace")
        if line.startswith(marker):
            out.append(line[len(marker):])
            if len(out) >= _MAX_LINES:
                break
    return out


def facts_script() -> str:
    """One round trip: uid, the session's PATH, PID 1's PATH, where each tool is."""
    tools = " ".join(TOOLS)
    return (
        f'e="${{{PID1_SEAM}:-{PID1_ENVIRON}}}"; p1=""\n'
        # PID 1's environ is NUL-separated KEY=value; only PATH is read, never a secret.
        'if [ -f "$e" ] && [ -r "$e" ]; then p1=$(tr "\\000" "\\n" < "$e" 2>/dev/null | sed -n "s/^PATH=//p" '
        "| head -n 1 | head -c 2000); fi\n"
        'echo "LPFACT uid=$(id -u 2>/dev/null)"\n'
        'echo "LPFACT path=$(printf %s "$PATH" | head -c 2000)"\n'
        'echo "LPFACT pid1path=$p1"\n'
        f'for t in {tools}; do echo "LPTOOL $t=$(command -v "$t" 2>/dev/null | head -n 1 | head -c 500)"; done\n'
        + gpu_script()
    )


def gpu_script() -> str:
    """The GPUs and the driver, as NVIDIA's ``nvidia-smi`` reports them (the container toolkit
    mounts it into every GPU container): one ``LPGPU name, driver_version, memory.total`` line per
    GPU, and the driver's CUDA version from its banner (``CUDA Version: 12.8``), the newest CUDA
    runtime that driver runs. Bounded by ``timeout`` where the host has it; nothing on a CPU host."""
    return (
        'T=""; command -v timeout >/dev/null 2>&1 && T="timeout 30"\n'
        "if command -v nvidia-smi >/dev/null 2>&1; then\n"
        "  $T nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null "
        "| head -n 64 | head -c 8000 | sed 's/^/LPGPU /'\n"
        "  $T nvidia-smi 2>/dev/null | head -n 6 | grep -o 'CUDA Version: *[0-9][0-9.]*' | head -n 1 "
        "| sed 's/^/LPCUDA /'\n"
        "fi\n"
    )


#: NVIDIA's minimum Linux driver for each CUDA toolkit (CUDA Toolkit release notes, table "CUDA
#: Toolkit and Corresponding Driver Versions"): a driver runs every runtime up to its banner's
#: CUDA version. Used only when the banner is missing (an old nvidia-smi).
DRIVER_CUDA: tuple[tuple[tuple[int, ...], str], ...] = (
    ((580, 65, 6), "13.0"), ((575, 51, 3), "12.9"), ((570, 26), "12.8"), ((560, 28, 3), "12.6"),
    ((555, 42, 2), "12.5"), ((550, 54, 14), "12.4"), ((545, 23, 6), "12.3"), ((535, 54, 3), "12.2"),
    ((530, 30, 2), "12.1"), ((525, 60, 13), "12.0"), ((520, 61, 5), "11.8"),
)


def cuda_of_driver(driver: str) -> str | None:
    """The newest CUDA runtime a driver version runs (``570.133.20`` -> ``12.8``)."""
    try:
        have = tuple(int(x) for x in driver.strip().split("."))
    except ValueError:
        return None
    return next((cuda for need, cuda in DRIVER_CUDA if have >= need), None)


#: Runs under each candidate: its version and whether it has torch (metadata only: no import).
_PY_PROBE = (
    "import sys\nv='%d.%d.%d' % tuple(sys.version_info[:3])\nt='-'\n"
    "try:\n import importlib.util as u, importlib.metadata as m\n"
    " if u.find_spec('torch'): t=m.version('torch')\nexcept Exception: pass\n"
    "print('LPPY '+v+' '+t)\n"
)


def pythons_script(paths: list[str]) -> str:
    """Each candidate that is an executable file: its version and torch, one marked line each."""
    cands = " ".join(shlex.quote(p) for p in paths)
    return (
        f"code={shlex.quote(_PY_PROBE)}\n"
        'T=""; command -v timeout >/dev/null 2>&1 && T="timeout 20"\n'
        f"for c in {cands}; do\n"
        '  case "$c" in /*) ;; *) c=$(command -v "$c" 2>/dev/null || true) ;; esac\n'
        '  [ -n "$c" ] && [ -f "$c" ] && [ -x "$c" ] || continue\n'
        '  raw=$($T "$c" -c "$code" </dev/null 2>&1 | head -c 4000)\n'
        '  out=$(printf "%s\\n" "$raw" | grep "^LPPY " | head -n 1 | head -c 200)\n'
        '  echo "LPPYTHON $c ${out#LPPY }"\n'
        # one that does not run: what it printed (a banner, an error), as one bounded line
        '  [ -n "$out" ] || printf "LPSAID %s %s\\n" "$c" "$(printf "%s" "$raw" | tr -c "[:print:]" " " | tail -c 160)"\n'
        "done\n"
    )


@dataclass
class Python:
    path: str
    where: str  # what put it among the candidates, in words
    version: tuple[int, ...] | None = None  # None: it did not run
    torch: str | None = None
    said: str = ""  # what one that did not run printed (bounded), for the refusal

    @property
    def usable(self) -> bool:
        return self.version is not None and self.version[:2] >= MIN_PYTHON

    def describe(self) -> str:
        if self.version is None:
            return f"{self.path} (does not run" + (f"; it said: {self.said}" if self.said else "; it printed nothing") + ")"
        v = ".".join(map(str, self.version))
        return f"{self.path} (Python {v}{', torch ' + self.torch if self.torch else ''})"


@dataclass(frozen=True)
class Gpus:
    """What ``nvidia-smi`` says: the GPUs' names and the driver, and the newest CUDA it runs."""

    names: tuple[str, ...] = ()
    driver: str | None = None
    cuda: str | None = None  # the driver's CUDA version ("12.8")

    def describe(self) -> str:
        if not self.names:
            return "no NVIDIA GPU (nvidia-smi lists none)"
        return (f"{len(self.names)} x {self.names[0]}, NVIDIA driver {self.driver or '?'} "
                f"(runs CUDA up to {self.cuda or '?'})")


@dataclass
class HostFacts:
    gpus: Gpus = field(default_factory=Gpus)
    uid: int | None = None
    path: str = ""  # the SSH session's PATH
    pid1_path: str = ""  # PID 1's PATH: the image's ENV PATH
    tools: dict[str, str] = field(default_factory=dict)  # name -> where (absent: not on the session's PATH)
    pythons: list[Python] = field(default_factory=list)

    @property
    def root(self) -> bool:
        return self.uid == 0

    def has(self, tool: str) -> bool:
        return bool(self.tools.get(tool))

    def describe(self) -> str:
        """One line for the events log: what the image gives an SSH session."""
        tools = ", ".join(f"{t} {'yes' if self.has(t) else 'no'}" for t in ("rsync", "tar", "apt-get", "dnf", "yum"))
        pid1 = ("PID 1's PATH unreadable" if not self.pid1_path else
                "PID 1's PATH differs from the session's" if self.pid1_path != self.path else
                "PID 1's PATH is the session's")
        return f"uid {self.uid if self.uid is not None else '?'}; {tools}; {pid1}; {self.gpus.describe()}"

    def to_dict(self) -> dict[str, Any]:
        return {"uid": self.uid, "path": self.path, "pid1_path": self.pid1_path, "tools": self.tools,
                "pythons": [p.describe() for p in self.pythons],
                "gpus": list(self.gpus.names), "driver": self.gpus.driver, "driver_cuda": self.gpus.cuda}


def parse_facts(stdout: bytes) -> HostFacts:
    facts = HostFacts()
    for line in _marked(stdout, "LPFACT "):
        key, _, value = line.partition("=")
        if key == "uid" and value.strip().isdigit():
            facts.uid = int(value.strip())
        elif key == "path":
            facts.path = value
        elif key == "pid1path":
            facts.pid1_path = value
    for line in _marked(stdout, "LPTOOL "):
        name, _, where = line.partition("=")
        if name in TOOLS and where.startswith("/"):
            facts.tools[name] = where
    facts.gpus = parse_gpus(stdout)
    return facts


_DRIVER = re.compile(r"^\d{2,4}(\.\d{1,4}){1,3}$")
_CUDA = re.compile(r"CUDA Version: *(\d{1,2})\.(\d{1,2})")


def parse_gpus(stdout: bytes) -> Gpus:
    """``LPGPU`` / ``LPCUDA`` lines (:func:`gpu_script`) -> :class:`Gpus`; anything malformed is dropped."""
    names, drivers = [], []
    for line in _marked(stdout, "LPGPU ")[:64]:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2 and parts[0] and _DRIVER.match(parts[1]):
            names.append(parts[0][:100])
            drivers.append(parts[1])
    cuda = None
    for line in _marked(stdout, "LPCUDA ")[:1]:
        m = _CUDA.search(line)
        if m:
            cuda = f"{int(m.group(1))}.{int(m.group(2))}"
    driver = drivers[0] if drivers else None
    if cuda is None and driver:
        cuda = cuda_of_driver(driver)
    return Gpus(tuple(names), driver, cuda if names else None)


def _path_dirs(path: str) -> list[str]:
    return [d.rstrip("/") or "/" for d in path.split(":") if d.startswith("/")]


def candidates(facts: HostFacts, explicit: str | None, container: bool = True,
               recorded: str = "") -> list[tuple[str, str]]:
    """(path, why it is a candidate) in the order they are preferred, without repeats.

    ``container``: a rented container, whose PID 1's PATH is its image's ``ENV PATH`` and comes
    first; on a machine you lend (``ssh://``), your session's PATH comes first. ``recorded``: the
    interpreter the catalog records for this image (its build files), tried before anything else
    but still probed, so a moved tag falls back to the search."""
    if explicit:
        return [(explicit, "given with --python")]
    pid1: list[tuple[str, str]] = [(recorded, "the image's own interpreter, as its build files have it")] if recorded else []
    session = set(_path_dirs(facts.path))
    for d in _path_dirs(facts.pid1_path):
        why = ("on PID 1's PATH (the image's ENV PATH)" if d in session else
               "on PID 1's PATH (the image's ENV PATH), which the SSH session does not get")
        pid1 += [(f"{d}/python3", why), (f"{d}/python", why)]
    ssh: list[tuple[str, str]] = []
    for d in _path_dirs(facts.path):
        ssh += [(f"{d}/python3", "on the SSH session's PATH"), (f"{d}/python", "on the SSH session's PATH")]
    out = [*pid1, *ssh] if container else [*ssh, *pid1]
    out += [(p, f"a known image location ({src})") for p, src in KNOWN_PYTHONS]
    first: dict[str, str] = {}
    for path, why in out:
        first.setdefault(path, why)  # the first mention, and its reason, wins
    return list(first.items())


_PYLINE = re.compile(r"^(\S+) (?:(\d+)\.(\d+)\.(\d+) (\S+))?\s*$")


def parse_pythons(stdout: bytes, cands: list[tuple[str, str]]) -> list[Python]:
    why = dict(cands)
    found: dict[str, Python] = {}
    for line in _marked(stdout, "LPPYTHON "):
        m = _PYLINE.match(line)
        if not m:
            continue
        path = m.group(1)
        # a bare --python name comes back resolved: keep the reason given for the name
        reason = why.get(path) or (why[cands[0][0]] if len(cands) == 1 else None)
        if reason is None or path in found:
            continue
        version = tuple(int(m.group(i)) for i in (2, 3, 4)) if m.group(2) else None
        torch = m.group(5) if m.group(5) and m.group(5) != "-" else None
        found[path] = Python(path, reason, version, torch[:40] if torch else None)
    for line in _marked(stdout, "LPSAID "):
        path, _, said = line.partition(" ")
        if path in found and found[path].version is None:
            found[path].said = said.strip()[:160]
    order = {p: i for i, (p, _) in enumerate(cands)}
    return sorted(found.values(), key=lambda p: order.get(p.path, len(order)))


@dataclass(frozen=True)
class Choice:
    python: str
    why: str


class NoUsablePython(RemoteError):
    """The instance has no Python lorapod can run with."""


def choose(pythons: list[Python], explicit: str | None) -> Choice:
    """The first usable Python that has torch, else the first usable one, with the reason in words."""
    usable = [p for p in pythons if p.usable]
    if not usable:
        seen = "; ".join(p.describe() for p in pythons) or (
            "no executable file by that name there" if explicit else
            "none on PID 1's PATH, the SSH PATH or the known places")
        what = (f"--python {explicit} cannot run lorapod" if explicit
                else "the instance has no Python >= 3.11 for lorapod")
        raise NoUsablePython(f"{what} (found: {seen})",
                             hint="use an image with Python >= 3.11 (--image), or pass --python PATH to one")
    best = next((p for p in usable if p.torch), usable[0])
    why = f"{best.describe()}: {best.where}"
    skipped = [p for p in pythons[: pythons.index(best)]]
    if skipped:
        why += "; passed over " + ", ".join(
            p.describe() + (" too old" if p.version is not None and not p.usable else " without torch"
                            if p.version is not None else "") for p in skipped)
    return Choice(best.path, why)
