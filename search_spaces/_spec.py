"""A search space is data: YAML -> one pure function -> frozen dataclasses.

`parse_space` imports nothing heavy; Optuna distributions are built on demand.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

TOP_KEYS = ("name", "description", "objective", "trials", "params", "fixed", "hypotheses", "samples", "profiles")
PROFILES = ("tiny", "sd15", "sdxl")  # model families a space may give ranges of their own
PROFILE_KEYS = ("params", "fixed", "trials")
NUMERIC_KEYS = ("type", "low", "high", "log", "step")
LAWS = ("power",)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class SpaceError(ValueError):
    """A bad search space; the message names the file, the key and the value."""


@dataclass(frozen=True)
class ParamSpec:
    name: str
    type: str  # float | int | categorical
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple[Any, ...] = ()

    @property
    def numeric(self) -> bool:
        return self.type != "categorical"

    def extremes(self) -> tuple[Any, ...]:
        """The values an objective's rules must accept: both bounds, or every choice."""
        return self.choices if not self.numeric else (self.low, self.high)

    def to_distribution(self) -> Any:
        import optuna.distributions as d

        if self.type == "float":
            return d.FloatDistribution(self.low, self.high, log=self.log, step=self.step)
        if self.type == "int":
            return d.IntDistribution(self.low, self.high, log=self.log, step=self.step or 1)
        return d.CategoricalDistribution(self.choices)


@dataclass(frozen=True)
class Hypothesis:
    """A pair the report must test; `law` (numeric params only) also asks for a fitted law."""

    x: str
    y: str
    law: str | None = None


@dataclass(frozen=True)
class SearchSpace:
    name: str
    description: str
    objective: str | None
    trials: int | None
    params: tuple[ParamSpec, ...]
    fixed: Mapping[str, Any] = field(default_factory=dict)
    hypotheses: tuple[Hypothesis, ...] = ()
    source: str = "<memory>"
    samples: Mapping[str, Any] = field(default_factory=dict)  # checked by the objective's SampleConfig
    # per model family, ranges and fixed values of its own over the ones above (the tiny model's)
    profiles: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    profile: str = ""  # the family this space was selected for (for_profile), "" when none

    def for_profile(self, family: str) -> SearchSpace:
        """This space for a model family: its profile's params replace those of the same name, its
        fixed values go over the others, its trials over the default. Without a profile of that
        family, the space as it is."""
        prof = self.profiles.get(family)
        if prof is None:
            return self
        base = self.to_dict()
        base.pop("profiles", None)
        merged = {**base, "params": {**base["params"], **dict(prof.get("params") or {})},
                  "fixed": {**base["fixed"], **dict(prof.get("fixed") or {})}}
        if prof.get("trials") is not None:
            merged["trials"] = prof["trials"]
        out = parse_space(merged, source=f"{self.source} (profile {family})")
        return SearchSpace(**{**out.__dict__, "source": self.source, "profile": family})

    def distributions(self) -> dict[str, Any]:
        return {p.name: p.to_distribution() for p in self.params}

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "objective": self.objective,
            "trials": self.trials,
            "params": {p.name: _param_dict(p) for p in self.params},
            "fixed": dict(self.fixed),
            "hypotheses": [{"x": h.x, "y": h.y, **({"law": h.law} if h.law else {})} for h in self.hypotheses],
            **({"samples": dict(self.samples)} if self.samples else {}),
            **({"profiles": {k: dict(v) for k, v in self.profiles.items()}} if self.profiles else {}),
        }


def _param_dict(p: ParamSpec) -> dict[str, Any]:
    if not p.numeric:
        return {"type": p.type, "choices": list(p.choices)}
    out: dict[str, Any] = {"type": p.type, "low": p.low, "high": p.high}
    if p.log:
        out["log"] = True
    if p.step is not None:
        out["step"] = p.step
    return out


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _parse_param(name: str, spec: Any, err: Any) -> ParamSpec:
    key = f"params.{name}"
    if not isinstance(spec, Mapping):
        raise err(key, spec, "must be a mapping with a 'type'")
    kind = spec.get("type")
    if kind not in ("float", "int", "categorical"):
        raise err(f"{key}.type", kind, "must be one of float, int, categorical")
    allowed = ("type", "choices") if kind == "categorical" else NUMERIC_KEYS
    for k in spec:
        if k not in allowed:
            raise err(f"{key}.{k}", spec[k], f"is not a key of a {kind} param (allowed: {', '.join(allowed)})")
    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, list) or not choices:
            raise err(f"{key}.choices", choices, "must be a non-empty list")
        for c in choices:
            if not (c is None or isinstance(c, (str, int, float, bool))):
                raise err(f"{key}.choices", c, "each choice must be a string, number, bool or null")
        if len(set(map(repr, choices))) != len(choices):
            raise err(f"{key}.choices", choices, "must not repeat a choice")
        return ParamSpec(name, kind, choices=tuple(choices))
    for bound in ("low", "high"):
        v = spec.get(bound)
        if not _is_number(v) or (kind == "int" and not isinstance(v, int)):
            raise err(f"{key}.{bound}", v, f"must be {'an int' if kind == 'int' else 'a finite number'}")
    low, high = spec["low"], spec["high"]
    if low >= high:
        raise err(f"{key}.low", low, f"must be < high ({high}); a single value belongs in fixed")
    log = spec.get("log", False)
    if not isinstance(log, bool):
        raise err(f"{key}.log", log, "must be true or false")
    if log and low <= 0:
        raise err(f"{key}.low", low, "must be > 0 when log=true")
    step = spec.get("step")
    if step is not None:
        if not _is_number(step) or step <= 0 or (kind == "int" and not isinstance(step, int)):
            raise err(f"{key}.step", step, f"must be a positive {'int' if kind == 'int' else 'number'}")
        if log:
            raise err(f"{key}.step", step, "cannot be combined with log=true")
    if kind == "float":
        low, high = float(low), float(high)
        step = float(step) if step is not None else None
    return ParamSpec(name, kind, low=low, high=high, log=log, step=step)


def parse_space(data: Any, *, source: str) -> SearchSpace:
    """Validate a loaded YAML document; raise SpaceError naming source, key and value."""

    def err(key: str, value: Any, rule: str) -> SpaceError:
        return SpaceError(f"{source}: {key}={value!r}: {rule}")

    if not isinstance(data, Mapping):
        raise err("<top>", type(data).__name__, "a search space must be a YAML mapping")
    for k in data:
        if k not in TOP_KEYS:
            raise err(str(k), data[k], f"unknown key (allowed: {', '.join(TOP_KEYS)})")
    name = data.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise err("name", name, "must be a non-empty name of letters, digits, '_', '.', '-'")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise err("description", description, "must be a string")
    objective = data.get("objective")
    if objective is not None and (not isinstance(objective, str) or not objective):
        raise err("objective", objective, "must be a built-in name or module:function")
    trials = data.get("trials")
    if trials is not None and (not isinstance(trials, int) or isinstance(trials, bool) or trials < 1):
        raise err("trials", trials, "must be an int >= 1")
    raw_params = data.get("params")
    if not isinstance(raw_params, Mapping) or not raw_params:
        raise err("params", raw_params, "must be a non-empty mapping of parameter name -> spec")
    params = tuple(_parse_param(str(n), s, err) for n, s in raw_params.items())
    fixed = data.get("fixed") or {}
    if not isinstance(fixed, Mapping):
        raise err("fixed", fixed, "must be a mapping of parameter name -> value")
    for k, v in fixed.items():
        if k in raw_params:
            raise err(f"fixed.{k}", v, "is also in params; a parameter is either sampled or fixed")
        if not (v is None or isinstance(v, (str, int, float, bool, list))):
            raise err(f"fixed.{k}", v, "must be a scalar or a list")
    hypotheses = _parse_hypotheses(data.get("hypotheses") or [], {p.name: p for p in params}, fixed, err)
    samples = data.get("samples") or {}
    if not isinstance(samples, Mapping):
        raise err("samples", samples, "must be a mapping (prompts, seeds, steps, scheduler, guidance_scale, enabled)")
    profiles = _parse_profiles(data.get("profiles") or {}, raw_params, err)
    space = SearchSpace(
        name=name, description=description, objective=objective, trials=trials,
        params=params, fixed=dict(fixed), hypotheses=hypotheses, source=source, samples=dict(samples),
        profiles={str(k): dict(v) for k, v in profiles.items()},
    )
    for family in profiles:  # every profile is a valid space of its own
        space.for_profile(family)
    return space


def _parse_hypotheses(raw: Any, by_name: Mapping[str, Any], fixed: Mapping[str, Any], err: Any) -> tuple:
    """The space's `hypotheses`: pairs of sampled params, each with an optional law between two
    numeric ones."""
    hypotheses = []
    if not isinstance(raw, list):
        raise err("hypotheses", raw, "must be a list of {x, y} or {x, y, law}")
    for i, h in enumerate(raw):
        if not isinstance(h, Mapping) or not {"x", "y"} <= set(h) or not set(h) <= {"x", "y", "law"}:
            raise err(f"hypotheses[{i}]", h, "must be a mapping with x, y and optionally law")
        law = h.get("law")
        for axis in ("x", "y"):
            p = by_name.get(h[axis]) if isinstance(h[axis], str) else None
            if p is None:
                what = "a fixed param" if isinstance(h[axis], str) and h[axis] in fixed else "not a param"
                raise err(f"hypotheses[{i}].{axis}", h[axis], f"must name a sampled param of this space ({what})")
            if law is not None and not p.numeric:
                raise err(f"hypotheses[{i}].{axis}", h[axis], "must name a numeric param when a law is given "
                          "(a pair without a law may be categorical)")
        if h["x"] == h["y"]:
            raise err(f"hypotheses[{i}].y", h["y"], "must differ from x")
        if law is not None and law not in LAWS:
            raise err(f"hypotheses[{i}].law", law, f"must be one of {', '.join(LAWS)} (or left out for a pair)")
        hypotheses.append(Hypothesis(h["x"], h["y"], law))
    return tuple(hypotheses)


def _parse_profiles(profiles: Any, raw_params: Mapping[str, Any], err: Any) -> Mapping[str, Any]:
    """The space's `profiles`: per model family, ranges of its params and values of other knobs."""
    if not isinstance(profiles, Mapping):
        raise err("profiles", profiles, f"must be a mapping of model family ({', '.join(PROFILES)}) -> params/fixed/trials")
    for family, prof in profiles.items():
        if family not in PROFILES:
            raise err(f"profiles.{family}", prof, f"unknown model family (known: {', '.join(PROFILES)})")
        if not isinstance(prof, Mapping) or not set(prof) <= set(PROFILE_KEYS):
            raise err(f"profiles.{family}", prof, f"must be a mapping with {', '.join(PROFILE_KEYS)}")
        for k in prof.get("params") or {}:
            if k not in raw_params:
                raise err(f"profiles.{family}.params.{k}", prof["params"][k],
                          "must be a param of the space (a profile gives its range for this family)")
        for k in prof.get("fixed") or {}:
            if k in raw_params:
                raise err(f"profiles.{family}.fixed.{k}", prof["fixed"][k], "is sampled by the space")
    return profiles


class _Loader(yaml.SafeLoader):
    """YAML as people write numbers: `1e-5` (no dot) is a float, as in YAML 1.2 and Python,
    where YAML 1.1 (PyYAML) reads it as a string."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def yaml_load(text: str) -> Any:
    """yaml.safe_load, with numbers such as 1e-5 read as numbers."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


def builtin_space_names() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("search_spaces").iterdir() if p.name.endswith(".yaml"))


def load_space(ref: str) -> SearchSpace:
    """A built-in name (see builtin_space_names) or a path to a YAML file."""
    path = Path(ref)
    if ref in builtin_space_names() and not path.exists():
        text = resources.files("search_spaces").joinpath(f"{ref}.yaml").read_text()
        source = f"<built-in {ref}>"
    elif path.is_file():
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise SpaceError(f"{ref}: cannot read ({exc.__class__.__name__})") from None
        source = str(path)
    else:
        import difflib

        close = difflib.get_close_matches(ref, builtin_space_names(), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise SpaceError(
            f"search space {ref!r}: no such file and no built-in of that name{hint} "
            f"(built-ins: {', '.join(builtin_space_names())})"
        )
    try:
        data = yaml_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or exc.__class__.__name__
        raise SpaceError(f"{source}: malformed YAML{where}: {problem}") from None
    return parse_space(data, source=source)
