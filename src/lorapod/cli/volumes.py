"""``lorapod volumes``: the network volumes on your RunPod account, what each costs a month, and delete.

Only RunPod's are listed: lorapod does not use Vast.ai's volumes, which are disk on one host's
machine, usable only while that machine has a free GPU (docs/remote.md, Volumes).
"""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

console = Console(highlight=False)
err = Console(stderr=True, highlight=False)


def monthly_line(timeout: float = 10.0) -> str | None:
    """What ``lorapod ps`` says about network volumes: their count and $/month, so nothing bills
    unseen. One bounded call, no retries (``ps`` must stay quick); None without a RunPod key."""
    from lorapod.compute.runpod.api import RunPodApi
    from lorapod.compute.runpod.volumes import NetworkVolumes
    from lorapod.errors import LorapodError

    try:
        api = RunPodApi(timeout=timeout, retries=1)
    except LorapodError:
        return None  # no RunPod key: no RunPod volumes lorapod could know of
    try:
        rows = NetworkVolumes(api).list()
    except LorapodError as exc:
        return f"network volumes: not listed ({exc.message}); `lorapod volumes` tries again"
    finally:
        api.close()
    if not rows:
        return None
    total = sum(v.usd_per_month for v in rows)
    names = ", ".join(f"{v.name or v.id} {v.size_gb} GB {v.datacenter}" for v in rows[:5])
    return (f"{len(rows)} RunPod network volume(s), ${total:.2f}/month whether used or not ({names}"
            f"{', ...' if len(rows) > 5 else ''}): `lorapod volumes --delete ID` stops one")


def register(app: typer.Typer) -> None:
    @app.command("volumes")
    def volumes(
        delete: str | None = typer.Option(None, "--delete", help="Delete this volume (its id) and what it holds."),
        yes: bool = typer.Option(False, "--yes", help="Do not ask before --delete."),
        as_json: bool = typer.Option(False, "--json", help="JSON on stdout, for scripts."),
    ) -> None:
        """RunPod network volumes: size, datacenter, $/month (billed always, attached or not)."""
        from lorapod.compute.runpod.volumes import NetworkVolumes
        from lorapod.errors import LorapodError

        vols = NetworkVolumes()
        if delete:
            found = [v for v in vols.list() if v.id == delete]
            if not found:
                raise LorapodError(f"no network volume {delete} on this RunPod account",
                                   hint="`lorapod volumes` lists them with their ids")
            v = found[0]
            if not yes and not typer.confirm(f"Delete network volume {v.id} ({v.name}, {v.size_gb} GB in "
                                             f"{v.datacenter}) and everything on it?", default=False, err=True):
                raise LorapodError("nothing deleted", hint="add --yes to skip the question")
            gone = vols.delete(v.id)
            err.print(f"deleted {v.id} (${v.usd_per_month:.2f}/month stops)" if gone else f"{v.id} was already gone")
            return
        rows = vols.list()
        if as_json:
            typer.echo(json.dumps([v.to_dict() for v in rows]))
            return
        if not rows:
            console.print("no network volumes on this RunPod account")
            return
        t = Table("id", "name", "GB", "datacenter", "$/month")
        for v in rows:
            t.add_row(v.id, v.name, str(v.size_gb), v.datacenter, f"{v.usd_per_month:.2f}")
        console.print(t)
        total = sum(v.usd_per_month for v in rows)
        console.print(f"{len(rows)} volume(s): ${total:.2f}/month, billed whether or not a pod uses them; "
                      "`lorapod volumes --delete ID` removes one")
