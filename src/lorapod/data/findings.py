"""Findings: what a check found, how bad it is, where, and what to do about it.

Every check in ``lorapod.data`` returns ``Finding`` objects instead of printing or raising, so the
same results feed the terminal, ``--json`` and the HTML report, and the exit status is decided in
one place (``Report.has_errors``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Severity = Literal["error", "warning", "info"]
SEVERITIES: tuple[Severity, ...] = ("error", "warning", "info")


@dataclass(frozen=True)
class Finding:
    """One problem (or fact) about the dataset.

    ``code`` is a stable kebab-case identifier (``caption-missing``) that scripts can filter on;
    ``message`` says what is wrong *and* what to do next.
    """

    severity: Severity
    code: str
    path: str
    message: str
    line: int | None = None

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, not {self.severity!r}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "severity": self.severity,
            "code": self.code,
            "path": self.path,
            "line": self.line,
            "message": self.message,
        }


def printable(text: str) -> str:
    """File names that are not valid UTF-8 reach Python as lone surrogates, which cannot be
    printed or written as JSON; show them with U+FFFD instead of crashing on output."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def finding(severity: Severity, code: str, path: str | Path, message: str, line: int | None = None) -> Finding:
    """Build a Finding with ``path`` as a string (callers hold Paths), safe to print."""
    return Finding(severity=severity, code=code, path=printable(str(path)), message=printable(message), line=line)


@dataclass
class Report:
    """All findings of one check, plus a summary of facts (counts, bucket plan, histogram).

    ``summary`` holds JSON-serialisable values only; ``extra`` holds anything the HTML report
    needs but the JSON output should not carry (thumbnails, per-image records).
    """

    findings: list[Finding] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def add(self, item: Finding) -> None:
        self.findings.append(item)

    def extend(self, items: list[Finding]) -> None:
        self.findings.extend(items)

    @property
    def has_errors(self) -> bool:
        return any(f.severity == "error" for f in self.findings)

    def counts(self) -> dict[str, int]:
        c = Counter(f.severity for f in self.findings)
        return {s: c.get(s, 0) for s in SEVERITIES}

    def sorted_findings(self) -> list[Finding]:
        """Errors first, then warnings, then info; stable by path and line inside each group."""
        order = {s: i for i, s in enumerate(SEVERITIES)}
        return sorted(self.findings, key=lambda f: (order[f.severity], f.path, f.line or 0, f.code))

    def to_dict(self) -> dict[str, Any]:
        summary = dict(self.summary)
        summary["counts"] = self.counts()
        return {"findings": [f.to_dict() for f in self.sorted_findings()], "summary": summary}
