"""Unpack the trainers' source archives and build each one's CPU virtualenv, for the real runs.

    python tools/upstream/setup.py [--archives ../shared/upstream] [--dir DIR] [--only TRAINER]

``--archives`` is the folder of source snapshots at lorapod's pinned commits (``../shared/upstream``
beside a CI clone; its README.md lists them): ``sd-scripts-<commit7>.tar.gz``,
``musubi-tuner-<commit7>.tar.gz``, ``ai-toolkit-<commit7>.tar.gz`` (the commits are the trainer
classes' own pins, ``trainers/<name>.py``) and ``diffusers-<commit7>.tar.gz`` (the diffusers commit
ai-toolkit's requirements_base.txt installs from git). Each is unpacked into ``DIR/src/<trainer>``.

Each trainer gets ``DIR/venv-<trainer>``: a virtualenv whose site-packages end with a ``.pth`` naming
the site-packages of the Python running this script (lorapod's, so torch 2.13 CPU, numpy, PIL and
tensorboard are shared and nothing large is installed twice), with the trainer's own pins installed
``--no-deps`` in front of it from ``tools/upstream/<trainer>-cpu.txt`` (each file says why each line is
there). musubi-tuner's checkout ``src/`` and ai-toolkit's diffusers ``src/`` are put on the path with a
``.pth`` too, in place of an editable install. ``cpu_shims.py`` goes into every one of them
(it acts only when ``LORAPOD_CPU_SHIMS`` names a shim).

Everything goes under ``--dir`` (default ``~/.cache/lorapod/upstream``, outside the clone). Nothing
is redone that is already right: an archive is unpacked again only when its sha256 changed,
a virtualenv rebuilt only when its requirements file, this Python or the archive changed (a
``.lorapod-built`` stamp), so a second CI run on the same machine costs seconds; a fresh machine builds
everything (pip's own cache keeps the wheels). ``DIR/env.sh`` gets the variables the ``upstream``
tests read (``LORAPOD_UPSTREAM_DIR``, ``LORAPOD_UPSTREAM_PYTHON_<TRAINER>``, ``LORAPOD_UPSTREAM_MODELS``).
Exits 2, saying so, when the archives are not there (a user's fresh clone).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import site
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
TRAINERS = ("sd-scripts", "musubi-tuner", "ai-toolkit")


def default_dir() -> Path:
    """Outside the clone, so that the next CI run on the same machine (a fresh clone) finds the
    virtualenvs and built models of the last one."""
    if os.environ.get("LORAPOD_UPSTREAM_CACHE"):
        return Path(os.environ["LORAPOD_UPSTREAM_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lorapod" / "upstream"


def pinned_commit(trainer: str) -> str:
    """The commit lorapod pins for ``trainer`` (its adapter class), so the archive name is not typed twice."""
    sys.path.insert(0, str(REPO / "src"))
    from lorapod.trainers import get

    commit = get(trainer).commit
    if not commit:
        raise SystemExit(f"{trainer} has no pinned commit")
    return commit


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def unpack(archive: Path, dest: Path) -> bool:
    """``archive`` (one top folder) into ``dest``, unless the same archive is already there. True if unpacked."""
    stamp = dest / ".lorapod-archive"
    digest = sha256(archive)
    if stamp.is_file() and stamp.read_text().strip() == digest:
        return False
    tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=dest.parent))
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        tops = [p for p in tmp.iterdir()]
        if len(tops) != 1 or not tops[0].is_dir():
            raise SystemExit(f"{archive} does not unpack to one folder (found {[p.name for p in tops]})")
        (tops[0] / ".lorapod-archive").write_text(digest + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        tops[0].rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return True


def site_packages(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    return Path(out)


def build_venv(trainer: str, root: Path, src: dict[str, Path], say) -> Path:
    """The trainer's virtualenv (see the module docstring); rebuilt only when its inputs changed."""
    venv = root / f"venv-{trainer}"
    python = venv / "bin" / "python"
    reqs = HERE / f"{trainer}-cpu.txt"
    lorapod_site = Path(site.getsitepackages()[0])
    # lorapod's own site-packages is not part of the key: the .pth naming it is rewritten below, so a
    # new clone (another path) reuses the virtualenv of the last one
    key = hashlib.sha256(json.dumps([reqs.read_text(), sys.version, str(venv)]).encode()).hexdigest()
    stamp = venv / ".lorapod-built"
    if not (stamp.is_file() and stamp.read_text().strip() == key and python.is_file()):
        t0 = time.monotonic()
        if venv.exists():
            shutil.rmtree(venv)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        # pip's own configuration applies (a machine's find-links / index / constraints)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check",
                        "-r", str(reqs)], check=True)
        stamp.write_text(key + "\n")
        say(f"{trainer}: virtualenv built in {time.monotonic() - t0:.0f} s ({venv})")
    else:
        say(f"{trainer}: virtualenv up to date ({venv})")
    sp = site_packages(python)
    # the .pth files are rewritten each time: they name paths of this clone
    (sp / "zz_lorapod.pth").write_text(f"{lorapod_site}\n")
    if trainer == "musubi-tuner":
        (sp / "musubi_tuner_src.pth").write_text(f"{src['musubi-tuner'] / 'src'}\n")
    if trainer == "ai-toolkit":
        (sp / "diffusers_aitk_src.pth").write_text(f"{src['diffusers-aitk'] / 'src'}\n")
    (sp / "lorapod_cpu_shims.py").write_text((HERE / "cpu_shims.py").read_text())
    (sp / "zz_lorapod_cpu_shims.pth").write_text("import lorapod_cpu_shims\n")
    return python


def aitk_diffusers_commit(aitk: Path) -> str:
    """The diffusers commit ai-toolkit installs from git (its requirements_base.txt)."""
    m = re.search(r"diffusers\.git@([0-9a-f]{7,40})", (aitk / "requirements_base.txt").read_text())
    if not m:
        raise SystemExit(f"no diffusers commit in {aitk / 'requirements_base.txt'}")
    return m.group(1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--archives", type=Path, default=REPO.parent / "shared" / "upstream")
    ap.add_argument("--dir", type=Path, default=default_dir(),
                    help="where the checkouts, virtualenvs and built models go and stay (default: "
                         "$LORAPOD_UPSTREAM_CACHE, else ~/.cache/lorapod/upstream)")
    ap.add_argument("--only", action="append", choices=TRAINERS, help="these trainers only (default: all three)")
    ns = ap.parse_args()
    say = lambda s: print(s, flush=True)  # noqa: E731
    archives, root = ns.archives.resolve(), ns.dir.resolve()
    if not archives.is_dir():
        print(f"no trainer archives at {archives}: the real runs are skipped (docs/trainers.md, 'Real runs')")
        return 2
    (root / "src").mkdir(parents=True, exist_ok=True)
    wanted = ns.only or list(TRAINERS)
    src: dict[str, Path] = {}
    for trainer in wanted:
        archive = archives / f"{trainer}-{pinned_commit(trainer)[:7]}.tar.gz"
        if not archive.is_file():
            raise SystemExit(f"{archive.name} is not in {archives} (lorapod pins {trainer} at {pinned_commit(trainer)})")
        src[trainer] = root / "src" / trainer
        say(f"{trainer}: {'unpacked' if unpack(archive, src[trainer]) else 'already unpacked'} {archive.name}")
    if "ai-toolkit" in wanted:
        commit = aitk_diffusers_commit(src["ai-toolkit"])
        archive = archives / f"diffusers-{commit[:7]}.tar.gz"
        if not archive.is_file():
            raise SystemExit(f"{archive.name} (ai-toolkit's diffusers at {commit}) is not in {archives}")
        src["diffusers-aitk"] = root / "src" / "diffusers-aitk"
        say(f"ai-toolkit's diffusers: {'unpacked' if unpack(archive, src['diffusers-aitk']) else 'already unpacked'}")
    pythons = {t: build_venv(t, root, src, say) for t in wanted}
    (root / "models").mkdir(exist_ok=True)
    lines = [f"export LORAPOD_UPSTREAM_DIR={root / 'src'}", f"export LORAPOD_UPSTREAM_MODELS={root / 'models'}"]
    lines += [f"export LORAPOD_UPSTREAM_PYTHON_{t.upper().replace('-', '_')}={p}" for t, p in pythons.items()]
    (root / "env.sh").write_text("\n".join(lines) + "\n")
    say(f"wrote {root / 'env.sh'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
