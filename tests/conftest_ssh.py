"""A real OpenSSH server on 127.0.0.1 that plays the rented machine in tests.

Started per test on a free unprivileged port with temporary host keys and an authorized_keys
file in tmp; StrictModes and PAM off so it runs as the current user (root here, hence
PermitRootLogin). Skipped with a reason when sshd/ssh/rsync are missing; under
``LORAPOD_REQUIRE_SYSTEM_TOOLS=1`` (CI) that is a failure instead.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if Path("/usr/sbin/sshd").exists() else None)


def require_tools(*names: str) -> None:
    missing = [n for n in names if not (SSHD if n == "sshd" else shutil.which(n))]
    if missing:
        msg = f"needs {', '.join(missing)} (apt-get install openssh-server openssh-client rsync)"
        if os.environ.get("LORAPOD_REQUIRE_SYSTEM_TOOLS") == "1":
            pytest.fail(msg + " and LORAPOD_REQUIRE_SYSTEM_TOOLS=1")
        pytest.skip(msg)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keygen(path: Path, comment: str = "lorapod-test") -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True, capture_output=True)
    return path


@dataclass
class Sshd:
    dir: Path
    port: int
    user: str
    client_key: Path
    work_root: Path
    proc: subprocess.Popen | None = None
    extra_config: str = ""

    @property
    def target(self) -> str:
        return f"ssh://{self.user}@127.0.0.1:{self.port}"

    def start(self) -> None:
        if os.geteuid() == 0 and not Path("/run/sshd").is_dir():
            # sshd's privilege-separation directory, normally made by the init script.
            Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)
        cfg = self.dir / "sshd_config"
        # A home of its own for the sessions: the test user's real ~/.bashrc (pyenv, conda...)
        # never runs, so a stale lock or a slow init script on the machine cannot stall the tests.
        home = self.dir / "home"
        home.mkdir(exist_ok=True)
        (home / ".bashrc").touch()
        lines = [
            f"Port {self.port}", "ListenAddress 127.0.0.1",
            f"HostKey {self.dir / 'host_ed25519'}", f"PidFile {self.dir / 'sshd.pid'}",
            f"AuthorizedKeysFile {self.dir / 'authorized_keys'}",
            "StrictModes no", "UsePAM no", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
            "PubkeyAuthentication yes", "PermitRootLogin yes" if os.geteuid() == 0 else "PermitRootLogin no",
            "MaxStartups 100", "MaxSessions 100", "LogLevel ERROR", "PrintMotd no",
            "AcceptEnv LANG", "Subsystem sftp internal-sftp",
        ]
        # sshd keeps only the first SetEnv line: HOME joins the one a fake instance brings, if any
        extra = self.extra_config.splitlines()
        setenv = [i for i, line in enumerate(extra) if line.strip().startswith("SetEnv ")]
        if setenv:
            extra[setenv[0]] += f" HOME={home}"
        else:
            extra.append(f"SetEnv HOME={home}")
        lines += extra
        cfg.write_text("\n".join(lines) + "\n")
        with open(self.dir / "sshd.log", "ab") as log:
            self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(cfg)], stdout=subprocess.DEVNULL,
                                         stderr=log, start_new_session=True)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited: {(self.dir / 'sshd.log').read_text()[-500:]}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.05)
        raise RuntimeError("sshd did not listen within 10 s")

    def authorize(self, pubkey: str) -> None:
        with open(self.dir / "authorized_keys", "a") as fh:
            fh.write(pubkey.strip() + "\n")

    def session_pids(self) -> list[int]:
        """The per-connection sshd processes (children of the listener)."""
        assert self.proc is not None
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True)
        return [int(x) for x in out.stdout.split()]

    def drop_connections(self) -> int:
        pids = self.session_pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return len(pids)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None


def new_sshd(d: Path, work: Path, extra_config: str = "") -> Sshd:
    """Host key, a client key already authorized, config in ``d``; started."""
    d.mkdir(parents=True, exist_ok=True)
    keygen(d / "host_ed25519", "host")
    client = keygen(d / "client_ed25519", "client")
    (d / "authorized_keys").write_text((d / "client_ed25519.pub").read_text())
    server = Sshd(d, free_port(), getpass.getuser(), client, work, extra_config=extra_config)
    server.start()
    return server


@pytest.fixture
def remote_root(tmp_path_factory, monkeypatch) -> Path:
    """Where work folders go on the loopback "instances" (instead of ~/.lorapod-work)."""
    work = tmp_path_factory.mktemp("work")
    monkeypatch.setenv("LORAPOD_REMOTE_ROOT", str(work))
    return work


@pytest.fixture
def sshd(tmp_path_factory, remote_root):
    require_tools("sshd", "ssh", "ssh-keygen", "rsync")
    server = new_sshd(tmp_path_factory.mktemp("sshd"), remote_root)
    yield server
    server.stop()


@pytest.fixture
def sshd_factory(tmp_path_factory, remote_root):
    """Start more sshds (one per fake cloud instance), each with extra config lines."""
    require_tools("sshd", "ssh", "ssh-keygen", "rsync")
    started: list[Sshd] = []

    def make(extra_config: str = "") -> Sshd:
        server = new_sshd(tmp_path_factory.mktemp("inst"), remote_root, extra_config)
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()
