"""Reading one dated data file, and saying how old it is."""

from __future__ import annotations

import datetime as dt
import difflib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import yaml

from lorapod.errors import PlanError

# A price older than this is flagged in every plan: GPU prices move month to month.
STALE_AFTER_DAYS = 90


@dataclass(frozen=True)
class Snapshot:
    """Where a set of facts came from and when they were checked."""

    name: str
    date: dt.date
    source: str

    def age_days(self, today: dt.date | None = None) -> int:
        return ((today or dt.date.today()) - self.date).days

    def describe(self, today: dt.date | None = None) -> str:
        days = self.age_days(today)
        return f"{self.name} snapshot of {self.date.isoformat()} ({days} days old)"

    def is_stale(self, today: dt.date | None = None) -> bool:
        return self.age_days(today) > STALE_AFTER_DAYS


@cache
def load_data(name: str) -> tuple[Snapshot, dict[str, Any]]:
    """Load ``data/<name>.yaml`` (cached); the file must carry snapshot_date and source."""
    text = resources.files("lorapod.catalog").joinpath("data", f"{name}.yaml").read_text(encoding="utf-8")
    raw = yaml.safe_load(text)
    try:
        date = dt.date.fromisoformat(str(raw["snapshot_date"]))
        source = str(raw["source"]).strip()
    except (KeyError, ValueError) as exc:
        raise PlanError(f"catalog file {name}.yaml lacks a valid snapshot_date/source ({exc})") from exc
    return Snapshot(name, date, source), raw


def closest(name: str, known: list[str], n: int = 3) -> list[str]:
    """The known names nearest to ``name`` (case-insensitive), best first."""
    lower = {k.lower(): k for k in known}
    hits = difflib.get_close_matches(name.lower(), list(lower), n=n, cutoff=0.4)
    if not hits:
        hits = [k for k in lower if name.lower() in k or k in name.lower()][:n]
    out: list[str] = []
    for h in hits:
        if lower[h] not in out:
            out.append(lower[h])
    return out


def closest_canonical(name: str, names: dict[str, str], n: int = 3) -> list[str]:
    """Like :func:`closest` over aliases, answered with the canonical name each alias stands for."""
    out: list[str] = []
    for hit in closest(name, list(names), n=3 * n):
        canon = names[hit]
        if canon not in out:
            out.append(canon)
    return out[:n]


def normalise(name: str) -> str:
    """'RTX_4090', 'rtx-4090' and 'RTX 4090' compare equal."""
    return " ".join(name.lower().replace("_", " ").replace("-", " ").split())
