"""The pieces under the host profiles: the interpreter choice, what a tar stream from the host may
write here, rsync's "command not found" as a fatal error, and the watchdog's proof of life."""

from __future__ import annotations

import io
import json
import os
import tarfile
import time
from pathlib import Path

import pytest

from lorapod.compute import hostfacts as hf
from lorapod.compute.remote import RemoteWork, WatchdogNotRunning
from lorapod.compute.transport import RemoteToolMissing, SSHTransport
from lorapod.compute.trust import excluded, receive_tar
from lorapod.compute.wait import retrying

from .conftest_ssh import new_sshd, require_tools
from .host_profiles import PROFILES, build


def py(path: str, where: str, version: tuple[int, ...] | None, torch: str | None = None) -> hf.Python:
    return hf.Python(path, where, version, torch)


def test_pid1_path_comes_first_and_says_the_session_lacks_it():
    facts = hf.HostFacts(path="/usr/bin:/bin", pid1_path="/opt/conda/bin:/usr/bin")
    cands = hf.candidates(facts, None)
    assert cands[0] == ("/opt/conda/bin/python3",
                        "on PID 1's PATH (the image's ENV PATH), which the SSH session does not get")
    assert ("/usr/bin/python3", "on PID 1's PATH (the image's ENV PATH)") in cands  # on both: said once
    paths = [c for c, _ in cands]
    assert len(paths) == len(set(paths)) and "/usr/local/bin/python" in paths  # known places last
    assert hf.candidates(facts, "python3.12") == [("python3.12", "given with --python")]
    # a machine you lend (ssh://): your session's PATH first, PID 1's after it
    lent = [c for c, _ in hf.candidates(facts, None, container=False)]
    assert lent[:2] == ["/usr/bin/python3", "/usr/bin/python"] and lent.index("/opt/conda/bin/python3") > 2


def test_the_first_python_with_torch_wins_and_the_others_are_named():
    pythons = [py("/usr/bin/python3", "on the SSH session's PATH", (3, 10, 12)),
               py("/usr/bin/python3.11", "on the SSH session's PATH", (3, 11, 2)),
               py("/usr/local/bin/python", "on the SSH session's PATH", (3, 12, 3), "2.8.0")]
    choice = hf.choose(pythons, None)
    assert choice.python == "/usr/local/bin/python"
    assert "torch 2.8.0" in choice.why and "3.10.12) too old" in choice.why and "without torch" in choice.why
    # no torch anywhere: the first usable one
    assert hf.choose(pythons[:2], None).python == "/usr/bin/python3.11"
    with pytest.raises(hf.NoUsablePython, match=r"no Python >= 3.11 for lorapod .*3\.10\.12") as err:
        hf.choose(pythons[:1], None)
    assert "--python PATH" in (err.value.hint or "")
    with pytest.raises(hf.NoUsablePython, match="--python /x cannot run lorapod"):
        hf.choose([py("/x", "given with --python", None)], "/x")
    with pytest.raises(hf.NoUsablePython, match="no executable file by that name there"):
        hf.choose([], "/nope/python3")


def test_the_probe_reads_only_its_own_lines_and_bounds_them():
    banner = b"Welcome to vast.ai. Have fun!\nLPFACT uid=0\n" + b"LPFACT path=/usr/bin:" + b"x" * 10000 + b"\n"
    out = banner + b"LPFACT pid1path=/opt/conda/bin\nLPTOOL tar=/usr/bin/tar\nLPTOOL rsync=\nLPTOOL evil=/x\n"
    facts = hf.parse_facts(out)
    assert facts.root and facts.pid1_path == "/opt/conda/bin" and len(facts.path) < 5000
    assert facts.tools == {"tar": "/usr/bin/tar"} and not facts.has("rsync")
    cands = [("/opt/conda/bin/python3", "pid1"), ("/usr/bin/python3", "session")]
    out = (b"conda: base environment\nLPPYTHON /usr/bin/python3 3.10.12 -\n"
           b"LPPYTHON /opt/conda/bin/python3 3.11.9 2.8.0+cu128\nLPPYTHON /not/asked 3.12.0 2.8.0\n")
    pythons = hf.parse_pythons(out, cands)
    assert [(p.path, p.version, p.torch) for p in pythons] == [
        ("/opt/conda/bin/python3", (3, 11, 9), "2.8.0+cu128"), ("/usr/bin/python3", (3, 10, 12), None)]
    assert hf.parse_pythons(b"LPPYTHON /usr/bin/python3 \n", cands)[0].version is None  # it did not run


def _tar(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    buf.seek(0)
    return buf


def _info(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mtime = kind, link, 1_700_000_000
    return info


def test_a_tar_stream_from_the_host_writes_only_regular_files_inside_the_run_folder(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    run = tmp_path / "run"
    stream = _tar([
        (_info("./metrics.jsonl"), b'{"step": 1}\n'),
        (_info("./checkpoints", tarfile.DIRTYPE), None),
        (_info("./checkpoints/step-1/state.json"), b"{}"),
        (_info("./escape", tarfile.SYMTYPE, str(outside)), None),
        (_info("./escape/owned"), b"x"),  # under the link just refused: a real folder here, never outside
        (_info("../up"), b"x"),
        (_info("/etc/passwd-lp"), b"x"),
        (_info("./hard", tarfile.LNKTYPE, "metrics.jsonl"), None),
        (_info("./fifo", tarfile.FIFOTYPE), None),
        (_info("./dev", tarfile.CHRTYPE), None),
        (_info("./job.log"), b"the instance's copy"),
        (_info("./.tmp-step-2/x"), b"half written"),
    ])
    (run / "job.log").parent.mkdir(parents=True)
    (run / "job.log").write_text("this machine's copy")
    files, size, refused = receive_tar(stream, run, excludes=("/job.log", ".tmp-*"))
    assert files == 3 and size == len(b'{"step": 1}\n') + 3
    assert (run / "escape").is_dir() and not (run / "escape").is_symlink()
    assert (run / "metrics.jsonl").read_bytes() == b'{"step": 1}\n'
    assert (run / "checkpoints" / "step-1" / "state.json").stat().st_mtime == 1_700_000_000
    assert sorted(refused) == ["../up", "/etc/passwd-lp", "dev", "escape", "fifo", "hard"]
    assert list(outside.iterdir()) == [] and not (tmp_path / "up").exists()
    assert (run / "job.log").read_text() == "this machine's copy" and not (run / ".tmp-step-2").exists()
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "escape", "job.log", "metrics.jsonl"]
    # a link planted here by anything else is never written through
    (run / "adapter").symlink_to(outside)
    _, _, refused = receive_tar(_tar([(_info("./adapter/x"), b"x")]), run)
    assert refused == ["adapter/x"] and list(outside.iterdir()) == []
    assert receive_tar(io.BytesIO(b""), run) == (0, 0, [])  # nothing there yet


def test_rsync_excludes_read_as_rsync_reads_them():
    pats = ("/job.log", ".tmp-*", "__pycache__", "STOP")
    assert excluded("job.log", pats) and not excluded("sub/job.log", pats)
    assert excluded("checkpoints/.tmp-step-4/a", pats) and excluded("pkg/lorapod/__pycache__/x.pyc", pats)
    assert excluded("STOP", pats) and not excluded("STOPPED", pats) and not excluded("metrics.jsonl", pats)


@pytest.fixture
def no_rsync_host(tmp_path, remote_root):
    require_tools("sshd", "ssh", "ssh-keygen", "rsync")
    host = build(PROFILES["no-rsync-no-mirror"], tmp_path / "image")
    sshd = new_sshd(tmp_path / "sshd", remote_root, host.sshd_config)
    yield sshd, host
    sshd.stop()
    host.stop()


def transport(sshd, tmp_path) -> SSHTransport:
    return SSHTransport("127.0.0.1", sshd.port, sshd.user, sshd.client_key, tmp_path / "known_hosts")


def test_rsync_missing_on_the_host_is_fatal_at_once_not_a_reconnect_loop(no_rsync_host, tmp_path):
    sshd, _ = no_rsync_host
    t = transport(sshd, tmp_path)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    t0 = time.monotonic()
    with pytest.raises(RemoteToolMissing, match="rsync is not installed on the instance") as err:
        retrying(lambda: t.push(tmp_path / "pkg", f"{sshd.work_root}/pkg"), time.monotonic() + 600, "upload")
    assert time.monotonic() - t0 < 30, "retried like a dropped connection"
    assert "tar" in (err.value.hint or "")
    t.close()


def test_tar_moves_files_both_ways_on_a_host_without_rsync(no_rsync_host, tmp_path):
    sshd, _ = no_rsync_host
    t = transport(sshd, tmp_path)
    t.mover = "tar"
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "a.bin").write_bytes(os.urandom(300_000))
    (src / "__pycache__").mkdir()
    (src / "__pycache__" / "x.pyc").write_bytes(b"x")
    (src / "link").symlink_to(src / "sub" / "a.bin")  # rsync -rt skips links: so does tar mode
    remote = f"{sshd.work_root}/job/run"
    st = t.push(src, remote, delete=True, excludes=("__pycache__",))
    assert st.files_transferred == 1 and st.literal_bytes == 300_000
    assert sorted(p.name for p in Path(remote).iterdir()) == ["sub"]
    os.mkfifo(Path(remote) / "fifo")  # the host plants a FIFO and a link out of the run folder
    (Path(remote) / "evil").symlink_to("/etc")
    back = tmp_path / "back"
    st = t.pull(remote, back)
    assert (back / "sub" / "a.bin").read_bytes() == (src / "sub" / "a.bin").read_bytes()
    assert sorted(st.refused) == ["evil", "fifo"] and sorted(p.name for p in back.iterdir()) == ["sub"]
    assert t.pull(f"{sshd.work_root}/not-yet", tmp_path / "none").files_transferred == 0
    # rsync's quick check: what is here with the same size and mtime is not sent again
    assert t.pull(remote, back).files_transferred == 0
    (Path(remote) / "sub" / "b.txt").write_text("new")
    st = t.pull(remote, back)
    assert (st.files_transferred, st.literal_bytes) == (1, 3) and (back / "sub" / "b.txt").read_text() == "new"
    t.push(src / "sub" / "a.bin", f"{sshd.work_root}/job/one.bin")  # a single file lands at its name
    assert Path(f"{sshd.work_root}/job/one.bin").stat().st_size == 300_000
    t.close()


def test_a_watchdog_that_dies_at_start_fails_the_setup_with_what_it_said(no_rsync_host, tmp_path):
    sshd, host = no_rsync_host
    broken = tmp_path / "python-broken"  # runs, but the watchdog dies at import (review row 5)
    broken.write_text(f'#!/bin/sh\ncase "$1" in *watchdog.py) echo "ModuleNotFoundError: No module named json" >&2;'
                      f' exit 1;; esac\nexec {host.image_python} "$@"\n')
    broken.chmod(0o755)
    work = RemoteWork(transport(sshd, tmp_path), "job-1", root=str(sshd.work_root))
    work.start_watchdog({"provider": "ssh", "poll_s": 0.3}, str(broken))
    t0 = time.monotonic()
    with pytest.raises(WatchdogNotRunning, match="ModuleNotFoundError: No module named json") as err:
        work.watchdog_alive(within_s=10)
    assert time.monotonic() - t0 < 8, "waited the whole bound for a process already dead"
    assert "destroyed" in (err.value.hint or "")
    work.start_watchdog({"provider": "ssh", "poll_s": 0.3, "heartbeat_timeout_s": 60}, host.image_python)
    pid = work.watchdog_alive(within_s=20)
    assert Path(f"/proc/{pid}").exists()
    work.teardown()
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
    work.transport.close()


def test_a_python_that_prints_a_banner_still_bootstraps(tmp_path, remote_root):
    """Review of #22, item 8: the start probe read only stderr and refused with an empty reason."""
    from lorapod.compute.remote import Bootstrap
    from lorapod.compute.transport import LocalTransport

    chatty = tmp_path / "python"
    chatty.write_text(f"#!/bin/sh\necho 'Welcome: conda base activated'\nexec {build.__globals__['sys'].executable}"
                      ' "$@"\n')
    chatty.chmod(0o755)
    work = RemoteWork(LocalTransport(tmp_path / "home"), "job-2", root=str(remote_root))
    work.prepare()
    facts = work.bootstrap(Bootstrap("source", python=str(chatty), deps="none"), tmp_path / "wheels")
    assert facts["lorapod"] and facts["job_python"] == str(chatty)
    (Path(work.dir) / "run" / "m.json").write_text(json.dumps({"a": 1}))
    assert list(work.manifest(str(chatty))) == ["m.json"]


def procs_with(needle: bytes) -> list[int]:
    """Processes whose environment mentions ``needle`` (a loopback host's sessions carry its PATH)."""
    out = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and int(d.name) != os.getpid() and needle in (d / "environ").read_bytes():
                out.append(int(d.name))
        except OSError:
            continue
    return out


def test_installing_rsync_is_bounded_and_falls_back_to_tar(tmp_path, remote_root):
    require_tools("sshd", "ssh", "ssh-keygen", "rsync")
    host = build(PROFILES["no-rsync-slow-mirror"], tmp_path / "image")
    sshd = new_sshd(tmp_path / "sshd", remote_root, host.sshd_config)
    try:
        work = RemoteWork(transport(sshd, tmp_path), "job-3", root=str(sshd.work_root))
        from lorapod.compute.remote import Bootstrap

        _, facts, choice = work.probe(Bootstrap())
        assert facts.root and facts.has("apt-get") and not facts.has("rsync") and choice.python == host.image_python
        t0 = time.monotonic()
        note = work.provide_rsync(facts, deadline_s=2)
        assert time.monotonic() - t0 < 15
        assert "installing it with apt-get did not finish" in note or "apt-get could not install it" in note, note
        assert "files move with tar" in note and work.transport.mover == "tar"
        assert procs_with(str(host.dir).encode()) == [], "the host's apt-get outlived its deadline"
        work.transport.close()
    finally:
        sshd.stop()
        host.stop()
