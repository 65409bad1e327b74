"""Who owns what: this lorapod home's installation id, the labels it gives instances at the
providers, and which controller process follows a job.

Each lorapod home has an installation id (:func:`installation_id`, in
``$LORAPOD_HOME/installation-id``) that goes into every instance's label at the provider, with
the ledger's own instance id (:func:`instance_label`). The orphan sweep destroys only instances
whose label carries this id, so two machines, two ``LORAPOD_HOME``s or two teammates on one
account never sweep each other's instances; the label also finds an instance whose create call
never answered. A job's controller is ``host:pid`` (:func:`controller_id`), alive only while
that process runs (:func:`controller_alive`).
"""

from __future__ import annotations

import os
import re
import socket
import uuid

from lorapod.fsutil import writer_tag
from lorapod.home import lorapod_home


def installation_id() -> str:
    """This lorapod home's id (8 hex digits), made once; it is in every instance label."""
    path = lorapod_home() / "installation-id"
    try:
        text = path.read_text().strip()
        if re.fullmatch(r"[0-9a-f]{8}", text):
            return text
    except OSError:
        pass
    new = uuid.uuid4().hex[:8]
    tmp = path.with_name(f".installation-id.{writer_tag()}")  # a sweep's threads each have their own
    tmp.write_text(new + "\n")
    try:
        os.link(tmp, path)  # first writer wins, even with two runs starting at once
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    return path.read_text().strip()


_LABEL = re.compile(r"lorapod-([0-9a-f]{8})-([0-9a-f]{12})-(.+)")


def instance_label(ledger_id: str, job_id: str | None) -> str:
    """The label an instance gets at the provider: ``lorapod-<installation>-<instance>-<job>``."""
    return f"lorapod-{installation_id()}-{ledger_id.removeprefix('i-')}-{job_id or 'x'}"


def parse_label(label: str | None) -> tuple[str, str] | None:
    """(installation id, ledger instance id) from a label made by :func:`instance_label`."""
    m = _LABEL.fullmatch(label or "")
    return (m.group(1), "i-" + m.group(2)) if m else None


def controller_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def controller_alive(controller: str | None) -> bool:
    """Whether the `lorapod run` that follows a job still runs (only knowable on its own host)."""
    if not controller or ":" not in controller:
        return False
    host, _, pid = controller.rpartition(":")
    if host != socket.gethostname():
        return True  # another machine's controller: assume alive, never tear its job down by accident
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError):
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return True
