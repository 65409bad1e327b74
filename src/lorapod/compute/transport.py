"""Running commands and moving files on an instance: OpenSSH + rsync (or tar), or the local shell.

We drive the system's OpenSSH client rather than a Python SSH library: it is what users already
trust and configure, it multiplexes (ControlMaster) and it is what ``rsync -e ssh`` needs anyway.
Every call is bounded by a timeout; a dropped connection (ssh exit 255, rsync 10/12/30/35/255)
is a :class:`ConnectionLost`, which callers retry with :func:`lorapod.compute.wait.retrying` until
their deadline. A tool missing on the instance (rsync's "remote command not found", exit 127, or
exit 12 with the remote shell's "command not found") is a :class:`RemoteToolMissing`: fatal at
once, because no reconnect brings it back.

Stock images often lack rsync (see :mod:`lorapod.compute.hostfacts`): with ``mover="tar"`` the
same pushes and pulls go as a tar stream over the SSH connection, received by the one policy of
:func:`lorapod.compute.trust.receive_tar` (regular files and folders inside the run folder only).

Paths on the instance are relative to the login directory (``$HOME``), which both ``ssh host
cmd`` and ``rsync host:path`` start from, so no round trip is needed to learn ``$HOME``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from lorapod.compute.trust import RSYNC_BASE, excluded, receive_tar, scrub_tree
from lorapod.errors import RemoteError

RSYNC_LOST = {10, 12, 30, 35, 255}


class ConnectionLost(RemoteError):
    """The connection dropped or could not be made; the operation may be retried."""


class AuthRefused(RemoteError):
    """The host refused our key: retrying will not help."""


class RemoteToolMissing(RemoteError):
    """A program lorapod runs on the instance is not there: retrying will not help."""


def _remote_missing(rc: int, err: str) -> bool:
    # rsync >= 3.2 exits 127 "remote command not found"; older ones exit 12 after the remote
    # shell's "rsync: command not found" (bash) or "rsync: not found" (dash).
    return rc == 127 or (rc == 12 and bool(re.search(r"rsync: (command )?not found", err)))


@dataclass
class SyncStats:
    files_transferred: int = 0
    literal_bytes: int = 0  # file content actually sent (not matched by the delta algorithm)
    total_size: int = 0
    refused: list[str] = field(default_factory=list)  # non-regular entries removed after a pull


class Transport(Protocol):
    def run(self, command: str, input: bytes | None = None, timeout: float = 60.0,
            check: bool = True) -> subprocess.CompletedProcess[bytes]: ...

    def push(self, local: Path, remote: str, delete: bool = False, excludes: tuple[str, ...] = (),
             timeout: float = 3600.0) -> SyncStats: ...

    def pull(self, remote: str, local: Path, excludes: tuple[str, ...] = (),
             timeout: float = 3600.0) -> SyncStats: ...

    def close(self) -> None: ...


def require_tool(name: str) -> str:
    path = shutil.which(name)
    if not path:
        raise RemoteError(f"'{name}' is not installed on this machine; remote runs need it",
                          hint="install OpenSSH client and rsync, e.g. `apt-get install openssh-client rsync`")
    return path


def _rsync_cmd(excludes: tuple[str, ...], delete: bool) -> list[str]:
    cmd = [require_tool("rsync"), *RSYNC_BASE]  # never -a: see lorapod.compute.trust
    if delete:
        cmd.append("--delete")
    for ex in excludes:
        cmd += ["--exclude", ex]
    return cmd


def _parse_stats(out: str) -> SyncStats:
    def num(label: str) -> int:
        m = re.search(rf"{label}:\s*([\d,.]+)", out)
        return int(m.group(1).replace(",", "").replace(".", "")) if m else 0

    return SyncStats(files_transferred=num("Number of regular files transferred"),
                     literal_bytes=num("Literal data"), total_size=num("Total file size"))


def _run_rsync(cmd: list[str], timeout: float, what: str) -> SyncStats:
    try:
        proc = subprocess.run(cmd, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise ConnectionLost(f"{what} timed out after {timeout:.0f} s") from exc
    err = proc.stderr.decode(errors="replace").strip()
    if _remote_missing(proc.returncode, err):
        raise RemoteToolMissing(f"{what}: rsync is not installed on the instance ({err[-300:]})",
                                hint="lorapod installs it (root + apt-get/yum) or moves files with tar when the "
                                     "instance probe finds it missing; on your own host: apt-get install rsync")
    if proc.returncode in RSYNC_LOST:
        if "Permission denied" in err:
            raise AuthRefused(f"{what}: the host refused the key ({err[-300:]})",
                              hint="check --identity and that its public key is in the host's authorized_keys")
        raise ConnectionLost(f"{what} failed (rsync exit {proc.returncode}): {err[-300:]}")
    if proc.returncode == 23 and "No such file" in err:  # the remote path is not there (yet)
        return SyncStats()
    if proc.returncode == 24:
        # rsync(1), EXIT VALUES: "24 Partial transfer due to vanished source files" - a warning:
        # the job removed an old checkpoint (keep_last) while it was listed; the rest arrived, and
        # the final pull is checked against the instance's checksums (compute/follow.py) and a cut-off
        # checkpoint is never resumed from (compute/recovery.py)
        return _parse_stats(proc.stdout.decode(errors="replace"))
    if proc.returncode != 0:
        hint = "the instance's disk may be full: raise compute.disk_gb" if "No space left" in err else None
        raise RemoteError(f"{what} failed (rsync exit {proc.returncode}): {err[-500:]}", hint=hint)
    return _parse_stats(proc.stdout.decode(errors="replace"))


class _KillAfter:
    """Kill ``proc`` after ``timeout`` seconds unless cancelled; ``fired`` says whether it did."""

    def __init__(self, proc: subprocess.Popen, timeout: float) -> None:
        self.fired = False

        def fire() -> None:
            self.fired = True
            proc.kill()

        self._timer = threading.Timer(timeout, fire)
        self._timer.daemon = True
        self._timer.start()

    def cancel(self) -> None:
        self._timer.cancel()


def _tree(local: Path, root_name: str | None, excludes: tuple[str, ...]) -> Iterator[tuple[Path, str]]:
    """(path, name in the archive) for a push: a file as ``root_name``, or a folder's regular files
    and folders (links, FIFOs, devices are skipped, as rsync ``-rt`` skips them)."""
    if root_name is not None:
        if local.is_file() and not local.is_symlink():
            yield local, root_name
        return
    for dirpath, dirnames, filenames in os.walk(local, followlinks=False):
        base = Path(dirpath)
        keep = []
        for d in sorted(dirnames):
            rel = (base / d).relative_to(local).as_posix()
            if not (base / d).is_symlink() and not excluded(rel, excludes):
                keep.append(d)
                yield base / d, rel
        dirnames[:] = keep
        for f in sorted(filenames):
            p = base / f
            rel = p.relative_to(local).as_posix()
            if not excluded(rel, excludes) and not p.is_symlink() and p.is_file():
                yield p, rel


def _local_files(root: Path) -> Iterator[tuple[str, int, int]]:
    """(relative name, size, whole-second mtime) of each regular file already pulled under ``root``."""
    for dirpath, _dirs, filenames in os.walk(root, followlinks=False):
        for f in filenames:
            p = Path(dirpath) / f
            rel = p.relative_to(root).as_posix()
            if "\n" in rel or p.is_symlink() or not p.is_file():
                continue
            st = p.stat()
            yield rel, st.st_size, int(st.st_mtime)


def _pulled(local: Path, st: SyncStats) -> SyncStats:
    """After every pull: only regular files and folders stay in the local run folder."""
    st.refused = [*st.refused, *scrub_tree(Path(local))]  # refused in the stream (tar), then on disk
    return st


@dataclass
class SSHTransport:
    """OpenSSH to one host, with a per-instance known_hosts (host key pinned on first use)."""

    host: str
    port: int
    user: str
    identity: Path | None
    known_hosts: Path
    connect_timeout: float = 10.0
    control_master: bool = True
    #: also trust (and check against) these, e.g. your ~/.ssh/known_hosts for an ssh:// host
    user_known_hosts: tuple[Path, ...] = ()
    #: how files move: ``rsync``, or ``tar`` over this connection when the instance has no rsync
    mover: str = "rsync"
    _control_dir: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        require_tool("ssh")
        self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
        if self.control_master:
            # Unix socket paths are short (~104 bytes): a private folder under /tmp, hashed name.
            self._control_dir = tempfile.mkdtemp(prefix="lp-ssh-")

    def ssh_options(self) -> list[str]:
        opts = [
            "-p", str(self.port),
            "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=accept-new",
            # new keys are pinned in the first file; a key that contradicts any of them is refused
            "-o", "UserKnownHostsFile=" + " ".join(f'"{p}"' for p in (self.known_hosts, *self.user_known_hosts)),
            *(() if self.user_known_hosts else ("-o", "GlobalKnownHostsFile=/dev/null")),
            "-o", f"ConnectTimeout={max(1, int(self.connect_timeout))}",
            "-o", "ServerAliveInterval=5",
            "-o", "ServerAliveCountMax=3",
            "-o", "LogLevel=ERROR",
        ]
        if self.identity:
            opts += ["-i", str(self.identity), "-o", "IdentitiesOnly=yes"]
        if self._control_dir:
            opts += ["-o", "ControlMaster=auto", "-o", f"ControlPath={self._control_dir}/%C",
                     "-o", "ControlPersist=60"]
        return opts

    @property
    def target(self) -> str:
        return f"{self.user}@{self.host}"

    def run(self, command: str, input: bytes | None = None, timeout: float = 60.0,
            check: bool = True) -> subprocess.CompletedProcess[bytes]:
        argv = [require_tool("ssh"), *self.ssh_options(), self.target, command]
        try:
            proc = subprocess.run(argv, input=input, capture_output=True, timeout=timeout,
                                  stdin=None if input is not None else subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            raise ConnectionLost(f"ssh {self.target}:{self.port} did not answer within {timeout:.0f} s") from exc
        if proc.returncode == 255:
            err = proc.stderr.decode(errors="replace").strip()
            if "Permission denied" in err:
                raise AuthRefused(f"{self.target}:{self.port} refused the key ({err[-200:]})",
                                  hint="check --identity and that its public key is in the host's authorized_keys")
            if "REMOTE HOST IDENTIFICATION HAS CHANGED" in err or "Host key verification failed" in err:
                raise RemoteError(f"{self.target}:{self.port}: the host key changed since it was pinned",
                                  hint=f"if the machine was really replaced, delete {self.known_hosts}")
            raise ConnectionLost(f"ssh {self.target}:{self.port}: {err[-300:] or 'connection failed'}")
        if check and proc.returncode != 0:
            err = proc.stderr.decode(errors="replace").strip()
            raise RemoteError(f"command on {self.host} failed (exit {proc.returncode}): {err[-500:]}",
                              hint="the instance's disk may be full: raise compute.disk_gb"
                              if "No space left" in err else None)
        return proc

    def _rsync_e(self) -> str:
        return shlex.join([require_tool("ssh"), *self.ssh_options()])

    def push(self, local: Path, remote: str, delete: bool = False, excludes: tuple[str, ...] = (),
             timeout: float = 3600.0) -> SyncStats:
        if self.mover == "tar":
            return self._tar_push(Path(local), remote, delete, excludes, timeout)
        src = str(local) + ("/" if Path(local).is_dir() else "")
        cmd = [*_rsync_cmd(excludes, delete), "-e", self._rsync_e(), src, f"{self.target}:{remote}"]
        return _run_rsync(cmd, timeout, f"upload of {local}")

    def pull(self, remote: str, local: Path, excludes: tuple[str, ...] = (),
             timeout: float = 3600.0) -> SyncStats:
        Path(local).mkdir(parents=True, exist_ok=True)
        if self.mover == "tar":
            return _pulled(local, self._tar_pull(remote, Path(local), excludes, timeout))
        cmd = [*_rsync_cmd(excludes, False), "-e", self._rsync_e(), f"{self.target}:{remote}/", str(local) + "/"]
        return _pulled(local, _run_rsync(cmd, timeout, f"download of {remote}"))

    # ------------------------------------------------------------------ tar over SSH (no rsync there)

    def _ssh_argv(self, command: str) -> list[str]:
        return [require_tool("ssh"), *self.ssh_options(), self.target, command]

    def _tar_push(self, local: Path, remote: str, delete: bool, excludes: tuple[str, ...],
                  timeout: float) -> SyncStats:
        """rsync's push, as a tar stream: regular files and folders only (as ``-rt`` without ``-l``),
        ``delete`` as a fresh copy of the folder. Every file is sent: there is no delta."""
        import posixpath
        import tarfile

        if local.is_dir():
            dest, root_name = remote, None
        else:
            dest, root_name = posixpath.dirname(remote) or ".", posixpath.basename(remote)
        q = shlex.quote
        script = (f"{'rm -rf ' + q(remote) + ' && ' if delete and local.is_dir() else ''}mkdir -p {q(dest)} && "
                  f"cd {q(dest)} && tar -xf - --no-same-owner")
        st = SyncStats()
        proc = subprocess.Popen(self._ssh_argv(script), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
        killed = _KillAfter(proc, timeout)
        try:
            try:
                with tarfile.open(fileobj=proc.stdin, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                    for path, rel in _tree(local, root_name, excludes):
                        info = tar.gettarinfo(str(path), arcname=rel)
                        info.uid = info.gid = 0
                        info.uname = info.gname = ""
                        info.mode = 0o755 if info.isdir() else 0o644 | (info.mode & 0o100)
                        if info.isreg():
                            with open(path, "rb") as fh:
                                tar.addfile(info, fh)
                            st.files_transferred += 1
                            st.literal_bytes += info.size
                        else:
                            tar.addfile(info)
            except (BrokenPipeError, OSError):
                pass  # the far side is gone: its exit status says why
            finally:
                with contextlib.suppress(OSError):
                    proc.stdin.close()  # type: ignore[union-attr]
            err = proc.stderr.read().decode(errors="replace").strip()  # type: ignore[union-attr]
            rc = proc.wait()
        finally:
            killed.cancel()
        st.total_size = st.literal_bytes
        self._tar_status(rc, err, f"upload of {local}", timeout, killed=killed.fired)
        return st

    def _tar_pull(self, remote: str, local: Path, excludes: tuple[str, ...], timeout: float) -> SyncStats:
        """rsync's pull, as a tar stream received by :func:`~lorapod.compute.trust.receive_tar`.

        Like rsync's quick check, a file whose size and mtime match the local copy is not sent
        (the list of what is here goes on stdin; the host leaves those out with ``tar -X``), so
        pulling every 30 s does not resend every checkpoint, which Vast.ai bills per byte."""
        # A missing folder is not an error (nothing there yet), as with rsync's exit 23 above.
        unanchored = " ".join(f"--exclude={shlex.quote(p)}" for p in excludes if not p.startswith("/"))
        script = (f"cd {shlex.quote(remote)} 2>/dev/null || {{ cat >/dev/null; exit 0; }}\n"
                  'ex=$(mktemp 2>/dev/null || echo "/tmp/.lp-tar-$$"); : > "$ex"\n'
                  "while IFS=' ' read -r size mtime path; do\n"
                  '  [ -f "./$path" ] && [ ! -h "./$path" ] && '
                  '[ "$(stat -c "%s %Y" "./$path" 2>/dev/null)" = "$size $mtime" ] && printf "./%s\\n" "$path" >> "$ex"\n'
                  "done\n"
                  # GNU tar: pattern options apply to the exclusions that follow them
                  f'tar -cf - --wildcards {unanchored} --anchored --no-wildcards -X "$ex" .; rc=$?\n'
                  'rm -f "$ex"; exit $rc\n')
        have = "".join(f"{size} {mtime} {rel}\n" for rel, size, mtime in _local_files(local)).encode()
        proc = subprocess.Popen(self._ssh_argv(script), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        killed = _KillAfter(proc, timeout)
        errs: list[bytes] = []
        drain = threading.Thread(target=lambda: errs.append(proc.stderr.read()), daemon=True)  # type: ignore[union-attr]
        drain.start()

        def feed() -> None:
            with contextlib.suppress(OSError):
                proc.stdin.write(have)  # type: ignore[union-attr]
                proc.stdin.close()  # type: ignore[union-attr]

        threading.Thread(target=feed, daemon=True).start()
        try:
            files, size, refused = receive_tar(proc.stdout, local, excludes)  # type: ignore[arg-type]
            with contextlib.suppress(OSError):
                proc.stdout.read()  # type: ignore[union-attr]
            rc = proc.wait()
            drain.join(5)
        finally:
            killed.cancel()
        err = b"".join(errs).decode(errors="replace").strip()
        self._tar_status(rc, err, f"download of {remote}", timeout, killed=killed.fired)
        return SyncStats(files_transferred=files, literal_bytes=size, total_size=size, refused=refused)

    def _tar_status(self, rc: int, err: str, what: str, timeout: float, killed: bool) -> None:
        if killed:
            raise ConnectionLost(f"{what} timed out after {timeout:.0f} s")
        if rc == 255:
            if "Permission denied" in err:
                raise AuthRefused(f"{what}: the host refused the key ({err[-300:]})")
            raise ConnectionLost(f"{what} failed (ssh exit 255): {err[-300:]}")
        if rc == 127:
            raise RemoteToolMissing(f"{what}: tar is not installed on the instance ({err[-300:]})",
                                    hint="use an image that has tar or rsync (--image)")
        if rc not in (0, 1):  # GNU tar: 1 = "some files differ" (a file changed while read): the next pull fixes it
            hint = "the instance's disk may be full: raise compute.disk_gb" if "No space left" in err else None
            raise RemoteError(f"{what} failed (tar over ssh, exit {rc}): {err[-500:]}", hint=hint)

    def close(self) -> None:
        if self._control_dir:
            subprocess.run([require_tool("ssh"), *self.ssh_options(), "-O", "exit", self.target],
                           capture_output=True, timeout=10, stdin=subprocess.DEVNULL)
            shutil.rmtree(self._control_dir, ignore_errors=True)
            self._control_dir = None


@dataclass
class LocalTransport:
    """The same operations on this machine, rooted at ``home`` (the local provider's "$HOME")."""

    home: Path

    def __post_init__(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)

    def _abs(self, remote: str) -> str:
        return remote if remote.startswith("/") else str(self.home / remote)

    def run(self, command: str, input: bytes | None = None, timeout: float = 60.0,
            check: bool = True) -> subprocess.CompletedProcess[bytes]:
        env = {k: v for k, v in os.environ.items() if k not in _LOCAL_SCRUB}
        env["HOME"] = str(self.home)
        try:
            proc = subprocess.run(["bash", "-c", command], input=input, capture_output=True, timeout=timeout,
                                  cwd=self.home, env=env, stdin=None if input is not None else subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            raise RemoteError(f"local command timed out after {timeout:.0f} s: {command[:80]}") from exc
        if check and proc.returncode != 0:
            raise RemoteError(f"local command failed (exit {proc.returncode}): {proc.stderr.decode(errors='replace')[-500:]}")
        return proc

    def push(self, local: Path, remote: str, delete: bool = False, excludes: tuple[str, ...] = (),
             timeout: float = 3600.0) -> SyncStats:
        src = str(local) + ("/" if Path(local).is_dir() else "")
        return _run_rsync([*_rsync_cmd(excludes, delete), src, self._abs(remote)], timeout, f"copy of {local}")

    def pull(self, remote: str, local: Path, excludes: tuple[str, ...] = (),
             timeout: float = 3600.0) -> SyncStats:
        Path(local).mkdir(parents=True, exist_ok=True)
        return _pulled(local, _run_rsync([*_rsync_cmd(excludes, False), self._abs(remote) + "/", str(local) + "/"],
                                         timeout, f"copy of {remote}"))

    def close(self) -> None:
        pass


# Provider keys are never handed to jobs on this machine either.
_LOCAL_SCRUB = {"RUNPOD_API_KEY", "VAST_API_KEY"}


def ephemeral_key(folder: Path, comment: str) -> Path:
    """A fresh ed25519 key pair for one job (no passphrase; the private half stays 0600 here)."""
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    key = folder / "id_ed25519"
    if not key.exists():
        proc = subprocess.run([require_tool("ssh-keygen"), "-q", "-t", "ed25519", "-N", "", "-C", comment,
                               "-f", str(key)], capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise RemoteError(f"ssh-keygen failed: {proc.stderr.decode(errors='replace')[-300:]}")
    os.chmod(key, 0o600)
    return key


def public_key(identity: Path) -> str:
    pub = Path(str(identity) + ".pub")
    if pub.is_file():
        return pub.read_text().strip()
    proc = subprocess.run([require_tool("ssh-keygen"), "-y", "-f", str(identity)], capture_output=True,
                          timeout=30, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise RemoteError(f"cannot read the public half of {identity}",
                          hint="pass an unencrypted private key with --identity, or omit it for a fresh one")
    return proc.stdout.decode().strip()
