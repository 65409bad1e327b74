"""The smaller frictions a newcomer met in issue #38's trial, each through the command that showed it."""

from __future__ import annotations

from pathlib import Path

from .cli_helpers import run_cli

ROOT = Path(__file__).resolve().parents[1]


def test_an_image_spec_with_an_llm_family_names_the_fields_in_one_line_not_the_whole_spec(capsys):
    code, _out, err = run_cli(["plan", str(ROOT / "examples" / "sdxl-object-lora.yaml"),
                              "--set", "model.family=llm"], capsys)
    assert code == 2
    assert "model.family = 'llm' cannot train data.format 'images'" in err and "sdxl" in err
    assert "{'model'" not in err and "stabilityai" not in err  # not the spec dumped as a Python dict
    assert len([ln for ln in err.splitlines() if ln.strip()]) == 2  # the headline and the one problem
