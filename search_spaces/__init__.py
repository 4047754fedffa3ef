"""What to try: built-in search spaces (YAML files in this folder) and their validator."""

from __future__ import annotations

from ._spec import (
    Hypothesis,
    ParamSpec,
    SearchSpace,
    SpaceError,
    builtin_space_names,
    load_space,
    parse_space,
    yaml_load,
)

__all__ = [
    "Hypothesis",
    "ParamSpec",
    "SearchSpace",
    "SpaceError",
    "builtin_space_names",
    "load_space",
    "parse_space",
    "yaml_load",
]
