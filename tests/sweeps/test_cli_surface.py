"""The commands' surface as a user meets it: `csweep --help` and every command's --help, word for
word as the contract's CLI section documents them (cli_help.json holds the text they had when
the commands became modules; a new flag is added to it on purpose, never by accident)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

HELP = json.loads((Path(__file__).with_name("cli_help.json")).read_text())


def _helps() -> dict[str, str]:
    from sweeps.commands import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {"csweep": parser.format_help(), **{name: sp.format_help() for name, sp in sub.choices.items()}}


@pytest.fixture
def helps(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")  # argparse wraps at the terminal's width
    return _helps()


def test_every_command_and_its_help_is_unchanged(helps):
    assert list(helps) == list(HELP)  # the same commands, in the same order
    for name, text in HELP.items():
        assert helps[name] == text, f"csweep {name} --help changed"


def test_every_command_has_a_handler_in_its_own_module():
    from sweeps.commands import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sp in sub.choices.items():
        handler = sp.get_default("handler")
        assert callable(handler), name
        module = handler.__module__.rsplit(".", 1)[-1]
        assert module in {"run", "resume", "report", "spaces", "ui", "pull", "export_model"}, (name, module)
