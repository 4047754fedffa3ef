"""`csweep spaces` and `csweep params`: what a space file can name."""

from __future__ import annotations

import argparse
from typing import Any

from search_spaces import builtin_space_names, load_space


def add_parsers(sub: Any) -> None:
    sub.add_parser("spaces", help="list the built-in search spaces").set_defaults(handler=cmd_spaces)
    sub.add_parser("params", help="the built-in objective's parameters: default, rule, meaning").set_defaults(
        handler=cmd_params)


def cmd_spaces(a: argparse.Namespace) -> int:
    for name in builtin_space_names():
        space = load_space(name)
        profiles = f" [profiles: tiny, {', '.join(space.profiles)}]" if space.profiles else ""
        print(f"{name:<14} {space.description}{profiles}")
    return 0


def cmd_params(a: argparse.Namespace) -> int:
    from objectives import TEXTUAL_INVERSION_PARAMS

    import yaml

    # defaults as a space's YAML spells them (null, false), columns as wide as the longest entry
    shown = {name: yaml.safe_dump(rule.default, default_flow_style=True).strip().removesuffix("...").strip()
             for name, rule in TEXTUAL_INVERSION_PARAMS.items()}
    width = max(map(len, shown)) + 2
    value_width = max(map(len, shown.values())) + 2
    for name, rule in TEXTUAL_INVERSION_PARAMS.items():
        print(f"{name:<{width}}{shown[name]:<{value_width}}{rule.rule}: {rule.doc}")
    return 0

