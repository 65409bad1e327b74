"""`lorapod plan` piped or at 80 columns: the decision columns stay whole (no "…")."""

from __future__ import annotations

import subprocess

from .remote_helpers import REPO, cli_argv, cli_env


def test_plan_reads_at_80_columns():
    proc = subprocess.run([*cli_argv(), "plan", str(REPO / "examples" / "sdxl-object-lora.yaml"), "--images", "25"],
                          capture_output=True, text=True, timeout=120, env=cli_env(COLUMNS="80"))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert "…" not in proc.stdout
    head = next(line for line in lines if "provider" in line)
    assert head.split() == ["#", "provider", "GPU", "tier", "$/h", "fit", "total", "$/job"]
    first = lines[lines.index(head) + 2].split()
    assert first[0] == "1" and first[1] in ("runpod", "vast") and first[-1].startswith("$")
    assert float(first[-1][1:]) > 0 and first[-3] in ("fits", "tight")
