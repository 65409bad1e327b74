"""A minimal TOML writer for the dataset files kohya's trainers read.

Only what those files hold: tables, arrays of tables (``[[datasets]]``, ``[[datasets.subsets]]``)
and scalar / list values. Python's ``tomllib`` reads TOML but does not write it, and the shapes
here are small enough not to need another dependency; tests read every file back with tomllib.
"""

from __future__ import annotations

import json
from typing import Any


def value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)  # always has a '.' or an exponent: a TOML float, never an int
    if isinstance(v, str):
        return json.dumps(v)  # JSON string escapes are valid TOML basic-string escapes
    if isinstance(v, list):
        return "[" + ", ".join(value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def dumps(doc: dict[str, Any]) -> str:
    """``{"general": {...}, "datasets": [{..., "subsets": [{...}]}]}`` as TOML."""
    lines: list[str] = []

    def scalars(table: dict[str, Any], indent: str) -> None:
        for k, v in table.items():
            if not (isinstance(v, list) and v and isinstance(v[0], dict)):
                lines.append(f"{indent}{k} = {value(v)}")

    def tables(table: dict[str, Any], prefix: str, indent: str) -> None:
        for k, v in table.items():
            if isinstance(v, list) and v and isinstance(v[0], dict):
                for item in v:
                    lines.append("")
                    lines.append(f"{indent}[[{prefix}{k}]]")
                    scalars(item, indent)
                    tables(item, f"{prefix}{k}.", indent + "  ")

    for name, body in doc.items():
        if isinstance(body, dict):
            lines.append(f"[{name}]")
            scalars(body, "")
            lines.append("")
    tables({k: v for k, v in doc.items() if isinstance(v, list)}, "", "")
    return "\n".join(lines).strip("\n") + "\n"
