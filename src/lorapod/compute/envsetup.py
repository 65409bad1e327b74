"""Runs ON the instance, under its stock interpreter: make the Python environment a job needs.

Standard library only, because it runs before anything is installed. The controller sends this
file on stdin with one JSON argument (:class:`lorapod.compute.bootstrap.Lock` plus where envs
live) and reads one JSON line back on stdout; progress goes to stderr.

What it does, cheapest first:

1. The interpreter already has every pinned distribution at the pinned version and a torch new
   enough: use it as it is, install nothing (a custom image built for lorapod).
2. ``<envs>/<lock digest>/`` exists and is complete (``.ready``): reuse it, install nothing (a
   second job on the same instance or on a persistent volume).
3. Otherwise make a virtualenv there with ``--system-site-packages`` (the image's CUDA torch stays
   visible; when the interpreter is itself a venv its site-packages are added with a ``.pth``),
   install a torch only when the image's is missing or too old, then the pinned distributions
   with ``--no-deps`` (the lock is the whole closure, so nothing is resolved and torch is never
   replaced). ``uv`` is used when there is one on PATH or it can be pip-installed into the env;
   pip otherwise. The instance's own index configuration is honoured: pip reads it itself, and
   for uv the pip settings (``PIP_INDEX_URL``, ``pip.conf``) are passed on unless uv has its own.
   A lock file serialises two jobs building the same env; a failed build is removed.
"""

from __future__ import annotations

import configparser
import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time
from typing import Any


def redact(text: str) -> str:
    """Index URLs may carry credentials (https://user:token@mirror/simple): never print them."""
    return re.sub(r"(\w+://)[^/@\s]+@", r"\1***@", text)


def log(msg: str) -> None:
    print(f"[env] {redact(msg)}", file=sys.stderr, flush=True)


def release(version: str) -> tuple[int, ...]:
    """``2.13.0+cpu`` -> (2, 13, 0): enough to compare torch against a floor."""
    out = []
    for part in re.split(r"[.+]", version):
        if not part.isdigit():
            m = re.match(r"\d+", part)
            if m:
                out.append(int(m.group()))
            break
        out.append(int(part))
    return tuple(out)


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def last_json(stdout: str) -> Any:
    """The last JSON line a child Python printed: an interpreter (a wrapper, a ``sitecustomize``)
    may print a banner on stdout first."""
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith(("{", "[")):
            return json.loads(line)
    raise ValueError(f"no JSON in: {stdout.strip()[-200:]!r}")


def installed(python: str) -> dict[str, str]:
    """Every distribution ``python`` sees, normalised name -> version."""
    # The first on sys.path wins, as for an import: the env's own copy shadows the image's.
    code = ("import importlib.metadata as m, json, re\nout = {}\n"
            "for d in m.distributions():\n"
            "    n = d.metadata['Name']\n"
            "    if n: out.setdefault(re.sub(r'[-_.]+', '-', n).lower(), d.version)\n"
            "print(json.dumps(out))")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise SystemExit(fail(f"{python} cannot list its packages: {out.stderr.strip()[-300:]}", None))
    try:
        listed = last_json(out.stdout)
    except ValueError as exc:
        raise SystemExit(fail(f"{python} did not list its packages: {exc}", None)) from exc
    return {norm(k): v for k, v in listed.items()}


def missing(have: dict[str, str], pins: list[str]) -> list[str]:
    out = []
    for pin in pins:
        name, _, version = pin.partition("==")
        if have.get(norm(name)) != version:
            out.append(pin)
    return out


def torch_ok(have: dict[str, str], floor: str) -> bool:
    v = have.get("torch")
    return v is not None and release(v) >= release(floor)


#: Run under an interpreter on a GPU instance: does its torch really compute on the GPU? A real
#: ``torch.cuda.is_available()`` (False when the driver is older than the build's CUDA) and a small
#: matmul (a build without kernels for this GPU's architecture fails there, not at import).
GPU_PROBE = (
    "import json\ntry:\n import torch\n v = torch.__version__\n"
    " if not torch.cuda.is_available():\n  print(json.dumps({'ok': False, 'torch': v, 'cuda': torch.version.cuda, "
    "'why': 'torch.cuda.is_available() is False'}))\n"
    " else:\n  x = torch.ones(64, 64, device='cuda')\n  s = float((x @ x).sum())\n"
    "  print(json.dumps({'ok': s == 64.0 ** 3, 'torch': v, 'cuda': torch.version.cuda, "
    "'gpu': torch.cuda.get_device_name(0), 'why': 'a 64x64 matmul on the GPU gave %s' % s}))\n"
    "except Exception as exc:\n print(json.dumps({'ok': False, 'why': '%s: %s' % (type(exc).__name__, "
    "str(exc).splitlines()[0][:300] if str(exc) else '')}))\n"
)


def gpu_probe(python: str) -> dict[str, Any]:
    """:data:`GPU_PROBE` under ``python``: {"ok": bool, "torch", "cuda", "why"}."""
    try:
        out = subprocess.run([python, "-c", GPU_PROBE], capture_output=True, text=True, timeout=300,
                             stdin=subprocess.DEVNULL)
        return last_json(out.stdout)
    except (ValueError, subprocess.TimeoutExpired) as exc:
        return {"ok": False, "why": f"the probe did not answer ({type(exc).__name__})"}


def fail(message: str, package: str | None, index: str | None = None, output: str = "",
         kind: str = "install") -> str:
    return json.dumps({"ok": False, "error": redact(message), "package": package,
                       "index": redact(index) if index else None, "output": redact(output[-1500:]), "kind": kind})


def pip_settings() -> dict[str, list[str]]:
    """The instance's pip index settings: environment first, then its config files."""
    keys = {"index-url": "PIP_INDEX_URL", "extra-index-url": "PIP_EXTRA_INDEX_URL", "find-links": "PIP_FIND_LINKS",
            "cert": "PIP_CERT"}
    found: dict[str, list[str]] = {}
    files = ["/etc/pip.conf", os.path.expanduser("~/.pip/pip.conf"),
             os.path.join(os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config"), "pip", "pip.conf")]
    if os.environ.get("PIP_CONFIG_FILE") == os.devnull:
        files = []  # pip's own rule: no configuration file at all
    elif os.environ.get("PIP_CONFIG_FILE"):
        files.append(os.environ["PIP_CONFIG_FILE"])
    cp = configparser.ConfigParser()
    with contextlib.suppress(configparser.Error):
        cp.read([f for f in files if os.path.isfile(f)])
    for key, env in keys.items():
        if os.environ.get(env):
            found[key] = os.environ[env].split()
        else:
            for section in ("install", "global"):
                if cp.has_option(section, key):
                    found[key] = cp.get(section, key).split()
                    break
    return found


def uv_has_own_index() -> bool:
    if any(os.environ.get(k) for k in ("UV_INDEX_URL", "UV_DEFAULT_INDEX", "UV_INDEX", "UV_EXTRA_INDEX_URL")):
        return True
    cfg = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return any(os.path.isfile(p) for p in (os.path.join(cfg, "uv", "uv.toml"), "/etc/uv/uv.toml"))


def index_url() -> str:
    """The indexes the installer used, for the error message."""
    s = pip_settings()
    main = (os.environ.get("UV_DEFAULT_INDEX") or os.environ.get("UV_INDEX_URL")
            or (s.get("index-url") or ["https://pypi.org/simple"])[0])
    return " + ".join([main, *s.get("extra-index-url", [])])


def uv_index_args() -> list[str]:
    if uv_has_own_index():
        return []
    s = pip_settings()
    args = []
    for url in s.get("index-url", [])[:1]:
        args += ["--index-url", url]
    for url in s.get("extra-index-url", []):
        args += ["--extra-index-url", url]
    if s.get("extra-index-url"):
        args += ["--index-strategy", "unsafe-best-match"]  # what pip does: the best version on any index
    for url in s.get("find-links", []):
        args += ["--find-links", url]
    return args


def run(cmd: list[str], timeout: float = 3600, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    log(" ".join(cmd[:6]) + (" ..." if len(cmd) > 6 else ""))
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                          env={**os.environ, **(env or {})})


def uv_env() -> dict[str, str]:
    """pip's CA bundle (``cert``) for uv too, unless uv is told otherwise (a proxy with its own CA)."""
    cert = pip_settings().get("cert")
    if cert and not os.environ.get("SSL_CERT_FILE") and not uv_has_own_index():
        return {"SSL_CERT_FILE": cert[0]}
    return {}


def find_uv(env_python: str) -> str | None:
    """uv from the image, or pip-installed into the env (honouring pip's index); None: use pip."""
    found = shutil.which("uv")
    if found:
        return found
    out = run([env_python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "uv"], timeout=600)
    if out.returncode == 0:
        # The uv package knows where its binary went (the env's bin, or the image's if it had one).
        where = subprocess.run([env_python, "-c", "import uv; print(uv.find_uv_bin())"], capture_output=True,
                               text=True, timeout=60)
        if where.returncode == 0 and os.path.isfile(where.stdout.strip()):
            return where.stdout.strip()
    log("uv could not be installed; using pip: " + (out.stderr or out.stdout).strip()[-300:])
    return None


def install(env_python: str, uv: str | None, requirements: list[str], no_deps: bool,
            extra_index: str | None = None) -> subprocess.CompletedProcess:
    """``extra_index``: one more index (torch's, for a CUDA build) searched beside the instance's
    own; the install then also replaces what the env sees of the image's packages."""
    extra = ["--no-deps"] if no_deps else []
    if uv:
        more = ["--extra-index-url", extra_index, "--index-strategy", "unsafe-best-match"] if extra_index else []
        args = uv_index_args()
        if extra_index and "--index-strategy" in args:
            more = more[:2]
        return run([uv, "pip", "install", "--python", env_python, *args, *more, *extra, *requirements],
                   env=uv_env())
    more = ["--extra-index-url", extra_index, "--ignore-installed"] if extra_index else []
    return run([env_python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *more, *extra,
                *requirements])


def culprit(output: str, requirements: list[str]) -> str | None:
    """The requirement the installer complained about first (what the user must look for)."""
    low = output.lower()
    hits = []
    for req in requirements:
        name = norm(req.partition("==")[0])
        for variant in {name, name.replace("-", "_")}:
            i = low.find(variant)
            if i >= 0:
                hits.append((i, req))
    return min(hits)[1] if hits else None


def make_env(python: str, env: str) -> str:
    out = run([python, "-m", "venv", "--system-site-packages", env], timeout=600)
    if out.returncode != 0:
        # Debian's python3 without python3-venv has no ensurepip: an env without pip still
        # works when uv is on PATH.
        shutil.rmtree(env, ignore_errors=True)
        if not shutil.which("uv"):
            raise SystemExit(fail(f"{python} -m venv failed: {out.stderr.strip()[-400:]}", None))
        out = run([python, "-m", "venv", "--system-site-packages", "--without-pip", env], timeout=600)
        if out.returncode != 0:
            raise SystemExit(fail(f"{python} -m venv failed: {out.stderr.strip()[-400:]}", None))
    env_python = os.path.join(env, "bin", "python")
    # The interpreter is itself a virtualenv (or conda env): its packages are not "system" site
    # packages of the new env, so make them visible explicitly, after the env's own.
    probe = ("import json, site, sys; print(json.dumps([sys.prefix != sys.base_prefix, "
             "[p for p in site.getsitepackages() if p.startswith(sys.prefix)]]))")
    is_venv, dirs = last_json(subprocess.run([python, "-c", probe], capture_output=True, text=True,
                                             timeout=60).stdout)
    if is_venv and dirs:
        site_lines = subprocess.run([env_python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                    capture_output=True, text=True, timeout=60).stdout.strip().splitlines()[-1:] or ['']
        site_dir = site_lines[0]
        with open(os.path.join(site_dir, "_lorapod_base.pth"), "w") as fh:
            fh.write("\n".join(dirs) + "\n")
    return env_python


def main() -> None:
    cfg = json.loads(sys.argv[1])
    python, pins, floor = cfg["python"], cfg["pins"], cfg["torch_floor"]
    if sys.version_info < (3, 11):  # noqa: UP036 (runs under the instance's interpreter, maybe older)
        raise SystemExit(fail(f"Python {sys.version.split()[0]} at {python} is too old: lorapod needs >= 3.11",
                              None, kind="python"))
    t0 = time.monotonic()
    have = installed(python)
    need = missing(have, pins)
    gpu = bool(cfg.get("cuda_driver"))
    usable = torch_ok(have, floor)
    torch_note = None
    if usable and gpu:  # the image's torch is kept only when it computes on this GPU
        probe = gpu_probe(python)
        if not probe.get("ok"):
            usable = False
            torch_note = (f"the image's torch {have.get('torch')} cannot use this GPU ({probe.get('why')}); "
                          f"installing {cfg.get('torch_pin')} for the driver's CUDA {cfg['cuda_driver']}")
            log(torch_note)
    if not need and usable:
        print(json.dumps({"ok": True, "python": python, "how": "image", "installed": 0,
                          "torch": have.get("torch"), "seconds": round(time.monotonic() - t0, 2)}))
        return
    env = os.path.join(cfg["envs"], cfg["digest"])
    env_python = os.path.join(env, "bin", "python")
    os.makedirs(cfg["envs"], exist_ok=True)
    with open(env + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second job building the same env waits for the first
        if os.path.isfile(os.path.join(env, ".ready")) and os.path.isfile(env_python):
            have = installed(env_python)
            print(json.dumps({"ok": True, "python": env_python, "how": "reused", "installed": 0,
                              "torch": have.get("torch"), "env": env, "seconds": round(time.monotonic() - t0, 2)}))
            return
        shutil.rmtree(env, ignore_errors=True)  # a build that died half way
        try:
            result = build(python, env, pins, floor, cfg.get("torch_pin"), have, usable, cfg.get("torch_index"))
        except BaseException:
            shutil.rmtree(env, ignore_errors=True)
            raise
        result["seconds"] = round(time.monotonic() - t0, 2)
        if torch_note:
            result["torch_note"] = torch_note
        print(json.dumps(result))


def build(python: str, env: str, pins: list[str], floor: str, torch_pin: str | None, have: dict[str, str],
          keep_torch: bool | None = None, torch_index: str | None = None) -> dict:
    """``keep_torch``: the image's torch serves (None: when it is new enough). Otherwise torch is
    installed into the env with its own dependencies (the CUDA libraries), from ``torch_index``
    (torch's index for the driver's CUDA build) besides the instance's own, and over the image's
    copy, which the env would otherwise see through ``--system-site-packages``."""
    log(f"making {env} from {python}")
    env_python = make_env(python, env)
    uv = find_uv(env_python)
    steps: list[tuple[list[str], bool, str | None]] = []
    if not (torch_ok(have, floor) if keep_torch is None else keep_torch):
        steps.append(([torch_pin or f"torch>={floor}"], False, torch_index))
    todo = missing(installed(env_python), pins)
    if todo:
        steps.append((todo, True, None))
    count = 0
    for reqs, no_deps, extra_index in steps:
        out = install(env_python, uv, reqs, no_deps, extra_index)
        if out.returncode != 0:
            shutil.rmtree(env, ignore_errors=True)
            text = out.stdout + out.stderr
            pkg = culprit(text, reqs)
            where = (extra_index + " + " if extra_index else "") + index_url()
            raise SystemExit(fail(f"could not install {pkg or ', '.join(reqs[:3])} from {where} "
                                  f"with {'uv' if uv else 'pip'}", pkg, where, text))
        count += len(reqs)
    after = installed(env_python)
    still = missing(after, pins)
    if still or not torch_ok(after, floor):
        shutil.rmtree(env, ignore_errors=True)
        raise SystemExit(fail(f"the env does not hold what was installed: {', '.join(still[:5]) or 'torch'}",
                              (still or ["torch"])[0]))
    with open(os.path.join(env, ".ready"), "w") as fh:
        json.dump({"pins": pins, "torch": after.get("torch"), "made": time.time()}, fh)
    return {"ok": True, "python": env_python, "how": "built", "installed": count, "torch": after.get("torch"),
            "env": env, "installer": "uv" if uv else "pip"}


if __name__ == "__main__":
    try:
        main()
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(exc.code)
            sys.exit(1)
        raise
