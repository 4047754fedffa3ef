"""`csweep run`'s checks: the space, the model, --set and --health, the curve options and the
samples, each against its rule, before Ray starts, a model loads or storage is touched."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from search_spaces import SearchSpace, SpaceError, load_space

from ._options import UsageError


def model_family(model: str) -> str:
    """tiny, sd15 or sdxl: which of a space's profiles a model takes (config files or a single
    file's header only)."""
    from objectives import config_source

    model = config_source(model)
    if model in ("tiny", "tiny-sdxl"):
        return "tiny"
    if model.startswith("random:"):
        return model.split(":", 1)[1]
    return "sdxl" if (Path(model) / "text_encoder_2").is_dir() else "sd15"


def check_model(value: str, *, allow_pickle: bool = False) -> str:
    """The model the trials load: a built-in name or a diffusers folder as given; a single-file
    checkpoint checked from its header, a pickle one (where the user allows it) first converted
    once to .safetensors in the cache."""
    from objectives import (
        BUILTIN_MODELS, RANDOM_MODELS, CheckpointError, check_single_file, is_single_file, safe_copy_of_pickle,
    )

    if value in BUILTIN_MODELS + RANDOM_MODELS:
        return value
    path = Path(value)
    if is_single_file(value):
        try:
            if allow_pickle and path.suffix.lower() != ".safetensors" and path.is_file():
                path = safe_copy_of_pickle(path)
            check_single_file(path, value)
        except CheckpointError as exc:
            raise UsageError(str(exc)) from None
        return str(path.resolve())
    if not path.is_dir():
        raise UsageError(f"--model {value!r}: neither tiny, tiny-sdxl, random:sd15, random:sdxl, a directory "
                         "nor a .safetensors file")
    missing = [n for n in ("model_index.json", "unet", "vae", "text_encoder", "tokenizer", "scheduler")
               if not (path / n).exists()]
    if missing:
        raise UsageError(f"--model {value!r}: not a diffusers folder (missing {', '.join(missing)})")
    return value


def parse_overrides(items: Sequence[str], *, flag: str = "--set") -> dict[str, Any]:
    """KEY=VALUE pairs, each VALUE read as YAML the way a space file is (1e-4 is a number)."""
    import yaml

    from search_spaces import yaml_load

    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"{flag} {item!r}: must be KEY=VALUE")
        try:
            out[key.strip()] = yaml_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            out[key.strip()] = raw
    return out


def check_objective_params(space: SearchSpace, fixed: dict[str, Any], objective: Any, model: str) -> None:
    """Every fixed value, and both bounds (or every choice) of every sampled range, against the
    objective's rules and the model's shapes."""
    from objectives import check_against_model, check_param, model_limits

    if objective.params is None:
        return
    limits = model_limits(model)
    checks = [(f"fixed.{k}", k, v) for k, v in fixed.items()]
    checks += [(f"params.{p.name}", p.name, v) for p in space.params for v in p.extremes()]
    for where, name, value in checks:
        err = check_param(name, value, known=objective.params)
        if err is None and limits is not None:
            err = check_against_model(name, value, limits)
        if err:
            raise UsageError(f"{space.source}: {where}: {err}")
    if objective.builtin:
        check_val_every_fits(space, fixed)


def extremes(space: SearchSpace, fixed: dict[str, Any], name: str, *, builtin: bool = True) -> tuple[str, list[Any]]:
    """(where, the int values a param can take at its ends): its fixed value or its sampled
    bounds; else the built-in objective's default (a plug-in has none: no values)."""
    is_int = lambda v: isinstance(v, int) and not isinstance(v, bool)  # noqa: E731
    for p in space.params:
        if p.name == name:
            return f"params.{name}", [v for v in p.extremes() if is_int(v)]
    if name in fixed or not builtin:
        return f"fixed.{name}", [fixed[name]] if is_int(fixed.get(name)) else []
    from objectives import TEXTUAL_INVERSION_PARAMS

    return f"the default {name}", [TEXTUAL_INVERSION_PARAMS[name].default]


def check_val_every_fits(space: SearchSpace, fixed: dict[str, Any]) -> None:
    """val_every <= steps for every config the space can sample: the largest val_every against
    the fewest steps."""
    from objectives import check_val_every

    where, every = extremes(space, fixed, "val_every")
    _, steps = extremes(space, fixed, "steps")
    every = [v for v in every if v is not None]
    if every and steps:
        err = check_val_every(max(every), min(steps))
        if err:
            raise UsageError(f"{space.source}: {where}: {err}")


def check_curve_options(a: argparse.Namespace, space: SearchSpace, fixed: dict[str, Any],
                        objective: Any) -> tuple[float, ...]:
    """--score best and --early-stop dominated need a curve: the built-in objective validates
    during training; a plug-in must be a generator that yields its validations. The rungs must
    fit the fewest steps a trial can have. Returns the rungs."""
    from .._rungs import check_rungs, parse_rungs, rung_steps

    try:
        rungs = parse_rungs(a.rungs)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    wanted = [flag for flag, on in (("--score best", a.score == "best"),
                                    ("--early-stop dominated", a.early_stop == "dominated")) if on]
    if a.early_stop and a.no_early_stop:
        raise UsageError("--early-stop dominated and --no-early-stop contradict each other; give one")
    if not wanted:
        return rungs
    if not objective.builtin:
        import inspect

        if not inspect.isgeneratorfunction(objective.load()):
            raise UsageError(f"{wanted[0]}: objective {objective.target!r} reports no curve; make it a generator "
                             "that yields {'step': s, 'val_loss': v, 'peak_mem_mb': m} after each validation and "
                             "returns its final mapping (docs/objective.md)")
    if a.early_stop != "dominated":
        return rungs
    where, steps = extremes(space, fixed, "steps", builtin=objective.builtin)
    if not steps:
        raise UsageError("--early-stop dominated: the rungs are fractions of a trial's `steps`; the space has no "
                         "int parameter `steps` (fixed or sampled)")
    err = check_rungs(rungs, min(steps))
    if err is None and objective.builtin:  # a default val_every validates at the rungs too
        _, every = extremes(space, fixed, "val_every")
        for n in steps:
            for ve in [v for v in every if v is not None]:
                first = min(rung_steps(rungs, n))
                if math.ceil(first / ve) * ve >= n:
                    err = (f"--rungs {a.rungs}: a trial of {n} steps validating every {ve} steps has no "
                           f"validation between its first rung (step {first}) and its end; lower val_every")
                    break
    if err:
        raise UsageError(f"{space.source}: {where}: {err}")
    return rungs


def load_checked_space(ref: str) -> SearchSpace:
    try:
        return load_space(ref)
    except SpaceError as exc:
        raise UsageError(str(exc)) from None



def objective_names(text: str, *, samples: Any, builtin: bool) -> tuple[str, ...]:
    """--objectives, checked: fidelity needs the built-in objective's samples (a plug-in
    objective must return `fidelity` itself)."""
    from .._study import parse_objectives

    try:
        names = parse_objectives(text)
    except ValueError as exc:
        raise UsageError(f"--objectives: {exc}") from None
    if "fidelity" in names and builtin and samples is None:
        raise UsageError("--objectives fidelity: scores the trials' sample images, which are off "
                         "(--no-samples or `samples: {enabled: false}`); turn samples on")
    return names


def sample_settings(space: Any, a: argparse.Namespace, *, builtin: bool) -> dict[str, Any] | None:
    """The space's `samples:` block with --samples N / --no-samples over it, checked; None when
    no trial draws (--no-samples, `enabled: false`, or a plug-in objective, which draws its own)."""
    from objectives import SampleConfig

    if a.samples is not None and a.no_samples:
        raise UsageError("--samples and --no-samples contradict each other; give one")
    if a.fidelity_model is not None and a.no_samples:
        raise UsageError("--fidelity-model scores sample images; it cannot go with --no-samples")
    try:
        cfg = SampleConfig.from_mapping(space.samples)
    except ValueError as exc:
        raise UsageError(f"{space.source}: {exc}") from None
    if not builtin:
        if space.samples or a.samples is not None:
            raise UsageError("samples: only the built-in objectives draw sample images; "
                             "a plug-in objective logs its own")
        return None
    if a.no_samples or not cfg.enabled:
        return None
    over: dict[str, Any] = {}
    if a.samples is not None:
        over["seeds"] = a.samples
    if a.fidelity_model is not None:
        from objectives import check_fidelity_model

        err = check_fidelity_model(a.fidelity_model)
        if err:
            raise UsageError(err)
        over["fidelity_model"] = str(Path(a.fidelity_model).resolve())
    return SampleConfig.from_mapping({**cfg.to_dict(), **over}).to_dict()
