"""Objectives by name: the built-ins, or `module:function` plug-ins (resolved on the worker)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ._params import TEXTUAL_INVERSION_PARAMS, ParamRule


@dataclass(frozen=True)
class ObjectiveSpec:
    name: str
    target: str  # "module:function"
    builtin: bool
    params: Mapping[str, ParamRule] | None  # None: a plug-in, which takes any names

    def load(self) -> Callable[..., Mapping[str, Any]]:
        module, _, func = self.target.partition(":")
        return getattr(importlib.import_module(module), func)


BUILTIN_OBJECTIVES: dict[str, ObjectiveSpec] = {
    "textual_inversion": ObjectiveSpec(
        "textual_inversion", "objectives._textual_inversion:textual_inversion", True,
        TEXTUAL_INVERSION_PARAMS,
    ),
}


def get_objective(name: str) -> ObjectiveSpec:
    """A built-in by name, or a plug-in `module:function`; raises ValueError listing the valid names."""
    if name in BUILTIN_OBJECTIVES:
        return BUILTIN_OBJECTIVES[name]
    module, sep, func = name.partition(":")
    if not sep or not module or not func.isidentifier():
        raise ValueError(
            f"objective {name!r} is neither a built-in ({', '.join(BUILTIN_OBJECTIVES)}) "
            "nor of the form module:function"
        )
    return ObjectiveSpec(name, name, False, None)


def check_plugin_importable(spec: ObjectiveSpec) -> str | None:
    """Why a plug-in cannot be resolved here (the driver's working dir), or None."""
    if spec.builtin:
        return None
    module, _, func = spec.target.partition(":")
    try:
        mod = importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's module's fault
        return f"objective {spec.target!r}: cannot import module {module!r} ({exc.__class__.__name__}: {exc})"
    if not callable(getattr(mod, func, None)):
        return f"objective {spec.target!r}: module {module!r} has no callable {func!r}"
    return None
