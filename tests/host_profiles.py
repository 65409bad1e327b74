"""Loopback hosts that look like the images lorapod really rents, each built from documented facts.

The loopback sshd (tests/conftest_ssh.py) is kinder than any rented machine: its sessions have
this machine's PATH (rsync, a python3 with everything), and the fakes used to hand provider
variables to every session. A profile takes that away the way an image does, with the source of
each fact beside it:

* the SSH session's PATH is a folder of links to this machine's commands, minus what the image
  lacks (rsync, Python, package managers), given with sshd's ``SetEnv PATH=...``;
* the image's Python is this machine's test interpreter (it has lorapod's dependencies, as an
  image built for ML has torch), placed where the image keeps it (a conda prefix, or
  ``python`` beside a distribution ``python3`` without torch);
* "PID 1" is a real process started with the container's environment (its ``ENV PATH`` and the
  provider's variables); the session is told where its ``environ`` is with
  ``LORAPOD_PID1_ENVIRON`` (:data:`lorapod.compute.hostfacts.PID1_SEAM`), the one thing a real
  container does not need because its init really is PID 1;
* ``apt-get`` is a stand-in with apt's observable behaviour on these images: their Dockerfiles
  end with ``rm -rf /var/lib/apt/lists/*``, so ``apt-get install`` without ``update`` says
  ``E: Unable to locate package rsync`` (exit 100); with a mirror, ``update`` then ``install``
  puts ``rsync`` on PATH. No real package is installed on this machine.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from lorapod.compute.hostfacts import PID1_SEAM

#: sshd's default PATH for root sessions (OpenSSH ``_PATH_STDPATH`` + sbin dirs, Debian build).
SSH_DEFAULT_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
#: never linked from this machine: each profile decides whether the image has them
IMAGE_DECIDES = ("rsync", "python", "pip", "apt", "apt-get", "yum", "dnf", "conda", "uv", "uvx")

APT_GET = r"""#!/bin/sh
# Stand-in for apt-get on an image whose Dockerfile ran `rm -rf /var/lib/apt/lists/*`
# (runpod/containers official-templates/pytorch, pytorch/pytorch `official`): no package lists
# until `apt-get update`; with a mirror (MIRROR=1), `install rsync` then puts rsync on PATH.
lists="$(dirname "$0")/.apt-lists"
case "$*" in
  *update*) [ "$MIRROR" = slow ] && exec sleep 600  # a mirror that does not answer
            [ "$MIRROR" = 1 ] || { echo "E: Failed to fetch http://archive.ubuntu.com/ubuntu/dists/jammy/InRelease" >&2; exit 100; }
            touch "$lists"; exit 0 ;;
  *install*rsync*) if [ -f "$lists" ]; then ln -sf "$RSYNC" "$(dirname "$0")/rsync"; exit 0; fi
            echo "E: Unable to locate package rsync" >&2; exit 100 ;;
esac
exit 100
"""


@dataclass(frozen=True)
class Profile:
    """What an image's SSH session sees; ``source`` names where each fact comes from."""

    name: str
    source: str
    rsync: bool = True
    #: where the image's Python (with torch) is: "path" (python3 on the session's PATH), "conda"
    #: (only in <prefix>/bin, on PID 1's PATH alone), "python-not-python3" (``python`` has it,
    #: ``python3`` is the distribution's without torch)
    python: str = "path"
    apt: str | None = None  # None: no apt-get; "mirror": it installs rsync; "offline": it cannot; "slow": hangs
    #: provider variables in PID 1's environment only (never in the SSH session)
    pid1_env: bool = False
    #: the interpreter prints this on stdout before anything else (a wrapper or sitecustomize)
    python_banner: str | None = None


PROFILES = {p.name: p for p in (
    Profile("runpod-pytorch-2.8.0-py3.11",
            "runpod/containers official-templates/pytorch/Dockerfile at 9a7400d (the tag's build): "
            "apt install git wget curl bash libgl1 software-properties-common openssh-server nginx (no rsync); "
            "python3 -> /usr/bin/python3.11; root; rm -rf /var/lib/apt/lists/*",
            rsync=False, apt="mirror"),
    Profile("no-rsync-no-mirror",
            "the same image where apt-get cannot reach a mirror (its lists were removed at build time): "
            "apt-get install says 'Unable to locate package'",
            rsync=False, apt="offline"),
    Profile("no-rsync-slow-mirror",
            "the same image behind a mirror that does not answer: apt-get update hangs",
            rsync=False, apt="slow"),
    Profile("pytorch-pytorch-on-vast",
            "pytorch/pytorch Dockerfile stage official: apt-get install ca-certificates libjpeg-dev libpng-dev "
            "(no rsync), Python in /opt/conda, ENV PATH /opt/conda/bin:$PATH; vast-ai/docs "
            "guides/instances/docker-environment.mdx: image variables are not visible in SSH sessions",
            rsync=False, python="conda", apt="offline", pid1_env=True, python_banner="conda: base environment"),
    # Here `python` is the test interpreter (torch and lorapod's dependencies, as the image's
    # 3.12 has torch) and `python3` this machine's distribution Python, which has no torch: the
    # versions differ from the image's, the fact that matters (which of the two has torch) does not.
    Profile("runpod-base-python-vs-python3",
            "runpod/containers official-templates/base/Dockerfile: rsync installed; "
            "ln -sf /usr/bin/python3.12 /usr/local/bin/python; python3 stays the distribution's",
            python="python-not-python3"),
    Profile("provider-vars-in-pid1",
            "runpod-python runpod/cli/utils/ssh_cmd.py reads the pod's variables from /proc/1/environ; "
            "vast-ai/docs docker-environment.mdx: predefined variables are not in SSH sessions",
            pid1_env=True),
)}


@dataclass
class Host:
    """A built profile: the sshd config lines for it, and the "PID 1" process to stop."""

    profile: Profile
    dir: Path
    sshd_config: str
    init: subprocess.Popen | None = None
    session_path: str = ""
    pid1_path: str = ""
    image_python: str = ""
    extra: dict[str, str] = field(default_factory=dict)

    def stop(self) -> None:
        if self.init is not None and self.init.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.init.pid, signal.SIGKILL)
            self.init.wait(5)


def _tool_view(d: Path, keep: tuple[str, ...] = ()) -> Path:
    """A PATH folder: links to this machine's commands, minus what the image decides."""
    d.mkdir(parents=True, exist_ok=True)
    for src in SSH_DEFAULT_PATH:
        if not os.path.isdir(src):
            continue
        for name in sorted(os.listdir(src)):
            if name.startswith(IMAGE_DECIDES) and name not in keep:
                continue
            link = d / name
            if not os.path.lexists(link):
                os.symlink(os.path.join(src, name), link)
    return d


def _python_at(path: Path, banner: str | None) -> Path:
    """The image's interpreter at ``path``: this machine's test Python (it has what lorapod needs)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    say = f"echo {banner!r}\n" if banner else ""
    path.write_text(f"#!/bin/sh\n{say}exec {sys.executable} \"$@\"\n")
    path.chmod(0o755)
    return path


def build(profile: Profile, d: Path, env: dict[str, str] | None = None) -> Host:
    """Make the host's folders (and its PID 1 when the profile has one) under ``d``.

    ``env``: the provider's variables (and the fakes' marker); in the SSH session unless the
    profile keeps them in PID 1's environment."""
    env = dict(env or {})
    view = _tool_view(d / "usr-bin", keep=("rsync",) if profile.rsync else ())
    session: dict[str, str] = {}
    pid1_path = [str(view)]
    if profile.python == "path":
        image_py = _python_at(view / "python3", profile.python_banner)
    elif profile.python == "conda":
        image_py = _python_at(d / "opt" / "conda" / "bin" / "python3", profile.python_banner)
        os.symlink(image_py, image_py.parent / "python")
        pid1_path.insert(0, str(image_py.parent))  # ENV PATH /opt/conda/bin:$PATH
    elif profile.python == "python-not-python3":
        image_py = _python_at(view / "python", profile.python_banner)
        distro = shutil.which("python3", path="/usr/bin:/bin")
        assert distro, "the python-vs-python3 profile needs this machine's distribution python3"
        os.symlink(distro, view / "python3")
    else:
        raise ValueError(profile.python)
    if profile.apt:
        apt = view / "apt-get"
        apt.write_text(APT_GET)
        apt.chmod(0o755)
        session["RSYNC"] = shutil.which("rsync") or "/usr/bin/rsync"
        session["MIRROR"] = {"mirror": "1", "slow": "slow"}.get(profile.apt, "0")
    session["PATH"] = str(view)
    init = None
    marker = {k: v for k, v in env.items() if k == "LORAPOD_FAKE_INSTANCE"}
    if profile.pid1_env or profile.python == "conda":
        pid1 = {"PATH": ":".join(pid1_path), **env}
        init = subprocess.Popen(["sleep", "infinity"], env=pid1, start_new_session=True,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        session[PID1_SEAM] = f"/proc/{init.pid}/environ"
        session.update(marker)  # the fakes find a destroyed instance's processes by it
        if not profile.pid1_env:
            session.update(env)
    else:
        session.update(env)
    line = "SetEnv " + " ".join(f'"{k}={v}"' for k, v in session.items())
    return Host(profile, d, line, init, session_path=str(view), pid1_path=":".join(pid1_path),
                image_python=str(image_py))
