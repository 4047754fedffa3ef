"""`csweep`: every input is checked before Ray starts, a model loads or storage is touched."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from search_spaces import SearchSpace, SpaceError, builtin_space_names, load_space

from ._rungs import DEFAULT_RUNGS_TEXT
from ._study import OBJECTIVES, SAMPLERS

DEFAULT_WORKDIR = "./csweep_runs"
DEFAULT_OBJECTIVE = "textual_inversion"
DEFAULT_TRIALS = 20
STORAGE_DIALECTS = ("sqlite", "postgresql", "mysql")
TRACKING_SCHEMES = ("sqlite", "postgresql", "mysql", "http", "https", "file", "databricks")


class UsageError(Exception):
    """Bad input: one line on stderr, exit status 2, nothing written."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"csweep: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _positive_int(name: str):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an int >= 1, got {text!r}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{name} must be an int >= 1, got {value}")
        return value

    return parse


def _positive_float(name: str, *, zero_ok: bool = False):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got {text!r}") from None
        if value < 0 or (value == 0 and not zero_ok) or value != value:
            raise argparse.ArgumentTypeError(f"{name} must be {'>= 0' if zero_ok else '> 0'}, got {text}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="csweep", description="Hyperparameter coupling sweeps for SD embeddings and LoRAs.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--workdir", default=DEFAULT_WORKDIR, help="[./csweep_runs]")
        sp.add_argument("--storage", help="Optuna storage URL [sqlite:///WORKDIR/optuna.db]")
        sp.add_argument("--tracking-uri", help="MLflow tracking URI [sqlite:///WORKDIR/mlflow.db]")

    run = sub.add_parser("run", help="run a sweep over a search space")
    run.add_argument("space", help="a built-in space name (csweep spaces) or a YAML file")
    run.add_argument("--trials", type=_positive_int("--trials"), help="trials to add [the space's, else 20]")
    run.add_argument("--workers", type=_positive_int("--workers"), default=1, help="trials in flight [1]")
    run.add_argument("--study", help="study name [the space's name]")
    common(run)
    run.add_argument("--ray-address", help="join a running Ray cluster [start a local one]")
    run.add_argument("--sampler", choices=SAMPLERS, default="tpe")
    run.add_argument("--seed", type=int, help="sampler seed: the same seed samples the same sequence")
    run.add_argument("--until-decisive", action="store_true",
                     help="stop once every hypothesis (with none declared, every pair) has a decided "
                          "coupling verdict; --trials is the budget")
    run.add_argument("--seeds", type=_positive_int("--seeds"), default=1,
                     help="train every sampled config with K seeds; its val_loss is their mean [1]")
    run.add_argument("--seed-plan", choices=("every", "design"), default="every",
                     help="every: each config trains --seeds K seeds; design (--sampler coupling): --trials x K "
                          "training runs, K seeds on each config of the design's space-filling start (the "
                          "noise floor), one on each config after it [every]")
    run.add_argument("--model", default="tiny",
                     help="tiny, tiny-sdxl, random:sd15, random:sdxl (the real architectures, seeded random "
                          "weights: for --dry-run) or a local diffusers folder [tiny]")
    run.add_argument("--profile", choices=("tiny", "sd15", "sdxl"),
                     help="the space's ranges for this model family [from --model: tiny for the tiny models, "
                          "sdxl for a folder with text_encoder_2, else sd15]")
    run.add_argument("--data", help="folder of concept images [synthetic concepts]")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                     help="override a fixed parameter (repeatable)")
    run.add_argument("--objective", help="built-in name or module:function [the space's]")
    run.add_argument("--max-mem-mb", type=_positive_float("--max-mem-mb"),
                     help="memory budget; trials above it are infeasible")
    run.add_argument("--cpus-per-trial", type=_positive_float("--cpus-per-trial"),
                     help="[the CPUs shared among the trials in flight]; torch threads follow it")
    run.add_argument("--gpus-per-trial", type=_positive_float("--gpus-per-trial", zero_ok=True),
                     help="[1 when the cluster has GPUs, else 0]")
    run.add_argument("--max-retries", type=int, default=1,
                     help="re-runs of a trial whose worker process died [1]")
    run.add_argument("--max-fail-share", type=_positive_float("--max-fail-share"), default=0.5,
                     help="stop the sweep once more than this share of its trials failed [0.5]")
    run.add_argument("--no-early-stop", action="store_true",
                     help="never stop a trial early: neither a diverging one nor (--early-stop) a dominated "
                          "one (diagnostics are still computed)")
    run.add_argument("--early-stop", choices=("dominated",),
                     help="also stop a trial at a rung when a trial that reached the same step used no more "
                          "memory and had a clearly lower val_loss there (PRUNED, with the reason and rung)")
    run.add_argument("--rungs", default=DEFAULT_RUNGS_TEXT, metavar="F,F",
                     help=f"--early-stop dominated: the rungs, as fractions of a trial's steps [{DEFAULT_RUNGS_TEXT}]")
    run.add_argument("--score", choices=("final", "best"), default="final",
                     help="the study's val_loss: the trial's last validation, or its best validated step's "
                          "(then its exports and samples are that step's too) [final]")
    run.add_argument("--health", action="append", default=[], metavar="KEY=VALUE",
                     help="override a health threshold (see docs/objective.md: Training health)")
    run.add_argument("--samples", type=_positive_int("--samples"), metavar="N",
                     help="sample images per prompt and concept after each trial [the space's, else 2]")
    run.add_argument("--no-samples", action="store_true", help="draw no sample images")
    run.add_argument("--fidelity-model", metavar="PATH",
                     help="local CLIP or DINO folder that scores the samples' concept fidelity "
                          "[the base model's own VAE]")
    run.add_argument("--objectives", default=",".join(OBJECTIVES), metavar="LIST",
                     help="the study's objectives: val_loss,peak_mem_mb and optionally fidelity "
                          "(maximized; needs samples) [val_loss,peak_mem_mb]")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument("--dry-run", type=_positive_int("--dry-run"), metavar="N",
                     help="train N of the space's configs for 2 steps each here, print their peak memory and "
                          "step time (flagging those above --max-mem-mb), and add nothing to any study")

    res = sub.add_parser("resume", help="continue an interrupted study (same spec, same MLflow parent)")
    res.add_argument("study")
    common(res)
    res.add_argument("--workers", type=_positive_int("--workers"), default=1)
    res.add_argument("--ray-address")
    res.add_argument("--no-progress", action="store_true")

    rf = sub.add_parser("rerun-front", help="re-train the current Pareto front's configs with K fresh seeds")
    rf.add_argument("study")
    common(rf)
    rf.add_argument("--seeds", type=_positive_int("--seeds"), default=3, help="fresh seeds per config [3]")
    rf.add_argument("--workers", type=_positive_int("--workers"), default=1)
    rf.add_argument("--ray-address")
    rf.add_argument("--no-progress", action="store_true")

    syn = sub.add_parser("sync", help="back-fill MLflow from the study's storage, idempotently")
    syn.add_argument("study")
    common(syn)

    rep = sub.add_parser("report", help="(re)write the reports of a study from its storage")
    rep.add_argument("study")
    rep.add_argument("others", nargs="*", metavar="STUDY",
                     help="more studies: their fronts are overlaid in reports/compare-A-vs-B/")
    common(rep)

    sub.add_parser("spaces", help="list the built-in search spaces")
    sub.add_parser("params", help="the built-in objective's parameters: default, rule, meaning")

    ui = sub.add_parser("ui", help="start the MLflow UI for a workdir on 127.0.0.1")
    ui.add_argument("--workdir", default=DEFAULT_WORKDIR)
    ui.add_argument("--tracking-uri")
    ui.add_argument("--host", default="127.0.0.1")
    ui.add_argument("--port", type=int, default=5000)
    ui.add_argument("--workers", type=_positive_int("--workers"), default=1,
                    help="MLflow server processes [1: one person browsing]")

    pull = sub.add_parser("pull", help="write a trial's learned embeddings and LoRA where diffusers loads them")
    pull.add_argument("study")
    which = pull.add_mutually_exclusive_group(required=True)
    which.add_argument("--trial", type=int, metavar="N", help="the trial's number")
    which.add_argument("--front", action="store_true", help="every Pareto-front trial, one folder each")
    pull.add_argument("directory")
    pull.add_argument("--format", choices=("diffusers", "kohya"), default="diffusers",
                      help="diffusers' layout, or kohya's, which AUTOMATIC1111 and ComfyUI load [diffusers]")
    common(pull)

    exp = sub.add_parser("export-model", help="write a built-in model as a diffusers folder")
    exp.add_argument("model", choices=("tiny", "tiny-sdxl", "random:sd15", "random:sdxl"),
                     help="a tiny model, or the published SD 1.5 / SDXL architecture with seeded random weights "
                          "(about 4 GB / 14 GB in fp32), for dry runs on the real shapes")
    exp.add_argument("directory")
    return p


# --- checks (cheap: no torch, no Ray, nothing written) ------------------------------------
def default_storage(workdir: Path) -> str:
    return f"sqlite:///{(workdir / 'optuna.db').resolve()}"


def default_tracking(workdir: Path) -> str:
    return f"sqlite:///{(workdir / 'mlflow.db').resolve()}"


def artifact_root_for(tracking: str, workdir: Path) -> Path | None:
    """Artifacts beside a database-backed tracking store; a tracking server decides its own."""
    return None if tracking.startswith(("http://", "https://", "databricks")) else workdir / "mlartifacts"


def check_storage_url(url: str) -> None:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        raise UsageError(f"--storage {url!r}: not a database URL (e.g. sqlite:///optuna.db, postgresql://...)") from None
    dialect = parsed.get_backend_name()
    if dialect not in STORAGE_DIALECTS:
        raise UsageError(f"--storage {url!r}: dialect {dialect!r} is not one of {', '.join(STORAGE_DIALECTS)}")
    if dialect == "sqlite" and parsed.database and parsed.database != ":memory:":
        parent = Path(parsed.database).expanduser().resolve().parent
        if not parent.is_dir():
            raise UsageError(f"--storage {url!r}: folder {str(parent)!r} does not exist")


def check_tracking_uri(uri: str) -> None:
    scheme = uri.split(":", 1)[0].split("+", 1)[0] if "://" in uri or uri.startswith("file:") else ""
    if scheme not in TRACKING_SCHEMES:
        raise UsageError(f"--tracking-uri {uri!r}: scheme must be one of {', '.join(TRACKING_SCHEMES)}")


def check_ray_address(value: str) -> None:
    """Fail fast (no hang) when nothing answers at a cluster address."""
    import socket

    if value in ("auto", "local"):
        return
    hostport = value.split("://", 1)[-1]
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise UsageError(f"--ray-address {value!r}: must be HOST:PORT (or ray://HOST:PORT, or auto)")
    try:
        with socket.create_connection((host, int(port)), timeout=3):
            pass
    except OSError as exc:
        raise UsageError(f"--ray-address {value!r}: nothing answers at {host}:{port} ({exc.__class__.__name__}); "
                         "is the cluster up?") from None


def model_family(model: str) -> str:
    """tiny, sd15 or sdxl: which of a space's profiles a model takes (config files only)."""
    if model in ("tiny", "tiny-sdxl"):
        return "tiny"
    if model.startswith("random:"):
        return model.split(":", 1)[1]
    return "sdxl" if (Path(model) / "text_encoder_2").is_dir() else "sd15"


def check_model(value: str) -> None:
    if value in ("tiny", "tiny-sdxl", "random:sd15", "random:sdxl"):
        return
    path = Path(value)
    if not path.is_dir():
        raise UsageError(f"--model {value!r}: neither tiny, tiny-sdxl, random:sd15, random:sdxl nor a directory")
    missing = [n for n in ("model_index.json", "unet", "vae", "text_encoder", "tokenizer", "scheduler")
               if not (path / n).exists()]
    if missing:
        raise UsageError(f"--model {value!r}: not a diffusers folder (missing {', '.join(missing)})")


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
        _check_val_every(space, fixed)


def _extremes(space: SearchSpace, fixed: dict[str, Any], name: str, *, builtin: bool = True) -> tuple[str, list[Any]]:
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


def _check_val_every(space: SearchSpace, fixed: dict[str, Any]) -> None:
    """val_every <= steps for every config the space can sample: the largest val_every against
    the fewest steps."""
    from objectives import check_val_every

    where, every = _extremes(space, fixed, "val_every")
    _, steps = _extremes(space, fixed, "steps")
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
    from ._rungs import check_rungs, parse_rungs, rung_steps

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
    where, steps = _extremes(space, fixed, "steps", builtin=objective.builtin)
    if not steps:
        raise UsageError("--early-stop dominated: the rungs are fractions of a trial's `steps`; the space has no "
                         "int parameter `steps` (fixed or sampled)")
    err = check_rungs(rungs, min(steps))
    if err is None and objective.builtin:  # a default val_every validates at the rungs too
        _, every = _extremes(space, fixed, "val_every")
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


def _load_space(ref: str) -> SearchSpace:
    try:
        return load_space(ref)
    except SpaceError as exc:
        raise UsageError(str(exc)) from None


# --- commands ----------------------------------------------------------------------------
def run_config(a: argparse.Namespace) -> Any:
    """Every `run` option, checked, as the run's settings record (sweeps._settings.RunConfig);
    nothing written."""
    from objectives import HealthConfig, check_data_dir, check_plugin_importable, get_objective

    from ._settings import RunConfig

    space = _load_space(a.space)
    check_model(a.model)
    family = a.profile or model_family(a.model)
    if a.profile and space.profiles and a.profile not in space.profiles:
        raise UsageError(f"--profile {a.profile}: {space.source} has profiles {', '.join(space.profiles)} only")
    space = space.for_profile(family)
    objective_name = a.objective or space.objective or DEFAULT_OBJECTIVE
    try:
        objective = get_objective(objective_name)
    except ValueError as exc:
        raise UsageError(f"--objective: {exc}") from None
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    err = check_plugin_importable(objective)
    if err:
        raise UsageError(err)
    overrides = parse_overrides(a.overrides)
    sampled = {p.name for p in space.params}
    for key in overrides:
        if key in sampled:
            raise UsageError(f"--set {key}: {key!r} is sampled by the space; only fixed parameters can be set")
    fixed = {**space.fixed, **overrides}
    health = parse_overrides(a.health, flag="--health")
    if a.no_early_stop:
        health["early_stop"] = False
    try:
        HealthConfig.from_mapping(health)
    except ValueError as exc:
        raise UsageError(f"--health: {exc}") from None
    check_objective_params(space, fixed, objective, a.model)
    rungs = check_curve_options(a, space, fixed, objective)
    samples = sample_settings(space, a, builtin=objective.builtin)
    objectives = objective_names(a.objectives, samples=samples, builtin=objective.builtin)
    if a.max_retries < 0:
        raise UsageError(f"--max-retries must be an int >= 0, got {a.max_retries}")
    if a.max_fail_share > 1:
        raise UsageError(f"--max-fail-share must be in (0, 1], got {a.max_fail_share}")
    if a.ray_address:
        check_ray_address(a.ray_address)
    if a.data is not None:
        err = check_data_dir(a.data)
        if err:
            raise UsageError(err)
    if a.sampler == "coupling" and len(space.params) < 2:
        raise UsageError(f"--sampler coupling: {space.source} samples {len(space.params)} param; a coupling "
                         "design needs two or more")
    if a.seed_plan == "design" and a.sampler != "coupling":
        raise UsageError(f"--seed-plan design: the coupling design spends the seeds; use it with --sampler "
                         f"coupling, not {a.sampler}")
    if a.seed_plan == "design" and a.seeds < 2:
        raise UsageError("--seed-plan design: --seeds K is the runs per trial to spend; it needs K >= 2, "
                         f"got {a.seeds}")
    if a.until_decisive and len(space.params) < 2:
        raise UsageError(f"--until-decisive: {space.source} samples {len(space.params)} param, so there is no "
                         "pair to decide; sample two or more")
    workdir = Path(a.workdir).expanduser()
    storage = a.storage or default_storage(workdir)
    if a.storage:
        check_storage_url(storage)
    tracking = a.tracking_uri or default_tracking(workdir)
    check_tracking_uri(tracking)
    return RunConfig(
        space=space, study_name=a.study or space.name, trials=a.trials or space.trials or DEFAULT_TRIALS,
        workers=a.workers, workdir=workdir, storage=storage, tracking_uri=tracking,
        objective=objective_name, builtin=objective.builtin, fixed=fixed, model=a.model,
        data=str(Path(a.data).resolve()) if a.data else None, sampler=a.sampler, seed=a.seed, seeds=a.seeds,
        seed_plan=a.seed_plan, trials_are_runs=a.seed_plan == "design",
        until_decisive=a.until_decisive, score=a.score, early_stop=a.early_stop or "", rungs=rungs,
        profile=space.profile,
        ray_address=a.ray_address, cpus_per_trial=a.cpus_per_trial, gpus_per_trial=a.gpus_per_trial,
        max_mem_mb=a.max_mem_mb, health=health, samples=samples, progress=not a.no_progress,
        max_retries=a.max_retries, max_fail_share=a.max_fail_share, objectives=objectives,
        artifact_root=artifact_root_for(tracking, workdir),
    )


def objective_names(text: str, *, samples: Any, builtin: bool) -> tuple[str, ...]:
    """--objectives, checked: fidelity needs the built-in objective's samples (a plug-in
    objective must return `fidelity` itself)."""
    from ._study import parse_objectives

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


def cmd_run(a: argparse.Namespace) -> int:
    cfg = run_config(a)
    if cfg.early_stop == "dominated" and (cfg.until_decisive or cfg.sampler == "coupling") \
            and not any(p.name == "steps" for p in cfg.space.params):
        print("csweep: note: --early-stop dominated keeps the trials it stops out of the coupling fits (`steps` "
              f"is not sampled), so {'--until-decisive' if cfg.until_decisive else '--sampler coupling'} has fewer "
              "trials to decide with; leave it off for a coupling question", file=sys.stderr)
    if a.dry_run:
        return dry_run(cfg, a.dry_run)
    from ._runner import run_sweep
    from ._study import StudyMismatch, make_storage, mismatch

    if a.storage or Path(default_storage(cfg.workdir).removeprefix("sqlite:///")).exists():
        try:
            why = mismatch(make_storage(cfg.storage), cfg.study_name, cfg.objectives)
        except Exception as exc:  # noqa: BLE001 - an unreachable database is bad input
            raise UsageError(f"--storage {_redacted(cfg.storage)}: cannot connect ({exc.__class__.__name__})") from None
        if why:
            raise UsageError(why)
    cfg.workdir.mkdir(parents=True, exist_ok=True)
    try:
        out = run_sweep(cfg)
    except StudyMismatch as exc:
        raise UsageError(str(exc)) from None
    return _finish(out, cfg.workdir, a.tracking_uri, cfg.tracking_uri)


def dry_run(cfg: Any, n: int) -> int:
    """`csweep run SPACE --dry-run N`: N configs of the space (a scrambled Sobol sequence, seeded
    by --seed) trained for 2 steps each in this process on whatever device there is, with no
    validation during training, no samples and no early stop; per config its peak memory, its
    step time and whether it fits --max-mem-mb. Nothing is written: no storage, no MLflow."""
    if not cfg.builtin:
        raise UsageError("--dry-run trains the built-in objective's configs; a plug-in objective runs them itself")
    import time
    import warnings

    import optuna
    import torch

    from objectives._textual_inversion import pick_device, train

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    dists = cfg.space.distributions()
    sampler = optuna.samplers.QMCSampler(seed=cfg.seed if cfg.seed is not None else 0, warn_independent_sampling=False)
    study = optuna.create_study(sampler=sampler, directions=["minimize"])
    device = pick_device()
    print(f"dry run of {cfg.space.name}: {n} configs, 2 steps each, model {cfg.model}, on {device.type}")
    over = 0
    for i in range(n):
        trial = study.ask(fixed_distributions=dists)
        params = {**cfg.fixed, **trial.params, "steps": 2, "val_every": 2}
        stamps: list[float] = []
        started = time.perf_counter()
        try:
            res = train(params, model=cfg.model, data=cfg.data, health={"early_stop": False},
                        on_step=lambda s, m: stamps.append(time.perf_counter())).result
        except Exception as exc:  # noqa: BLE001 - a config that does not run is what a dry run is for
            name = "out of memory" if exc.__class__.__name__ == "OutOfMemoryError" else exc.__class__.__name__
            print(f"  {i}: {_params_text(trial.params)}: {name}: {str(exc)[:200]}")
            over += 1
            continue
        step = (stamps[-1] - stamps[-2]) if len(stamps) >= 2 else time.perf_counter() - started
        flag = ""
        if cfg.max_mem_mb is not None and res["peak_mem_mb"] > cfg.max_mem_mb:
            flag, over = f"  ABOVE --max-mem-mb {cfg.max_mem_mb:g}", over + 1
        print(f"  {i}: {_params_text(trial.params)}: peak {res['peak_mem_mb']:.1f} MB "
              f"({res['tags']['peak_mem_source']}), step {step:.3f} s{flag}")
    print(f"{over} of {n} configs above the budget or failing; nothing was added to any study")
    return 0


def _params_text(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())


def _finish(out: Any, workdir: Path, tracking_given: str | None, tracking: str) -> int:
    this_run = f"{out.completed} completed, {out.failed} failed, {out.pruned} pruned"
    if out.out_of_memory:
        this_run += f", {out.out_of_memory} out of memory"
    print(f"study {out.study_name}: this run {this_run}; the study holds {out.study_trials} trials"
          + (" (interrupted: `csweep resume " + out.study_name + "` continues)" if out.interrupted else ""))
    if out.decided:
        print(out.decided)
    print(f"reports: {out.report_dir}")
    print(f"MLflow:  csweep ui --workdir {workdir}" if tracking_given is None
          else f"MLflow:  {_redacted(tracking)} (parent run {out.parent_run_id})")
    if out.aborted:
        print(f"csweep: {out.aborted}", file=sys.stderr)
        return 1
    if out.interrupted and out.signal == "SIGTERM":  # as a shell reports a process that SIGTERM ended
        print(f"csweep: terminated (SIGTERM): the trials in flight ended FAIL 'interrupted', the reports are "
              f"written; `csweep resume {out.study_name}` continues", file=sys.stderr)
        return 143
    return 130 if out.interrupted else 0


def _open_existing(a: argparse.Namespace, name: str | None = None) -> tuple[Path, str, Any]:
    """Workdir, storage URL and the loaded study of `report`/`resume`/`sync`; exit 2 if absent."""
    name = name or a.study
    workdir = Path(a.workdir).expanduser()
    storage = a.storage or default_storage(workdir)
    if a.storage:
        check_storage_url(storage)
    elif not (workdir / "optuna.db").is_file():
        raise UsageError(f"study {name!r}: no storage at {workdir / 'optuna.db'} (wrong --workdir?)")
    from ._study import existing_directions, make_storage

    st = make_storage(storage)
    if existing_directions(st, name) is None:
        raise UsageError(f"study {name!r}: not in storage {_redacted(storage)}")
    import optuna

    from ._runner import quiet

    quiet()
    return workdir, storage, optuna.load_study(study_name=name, storage=st)


def _tracking_of(a: argparse.Namespace, study: Any, workdir: Path) -> str:
    """--tracking-uri, else the one the study's run used (when it held no password), else the default."""
    from . import _attrs as A

    if a.tracking_uri:
        return a.tracking_uri
    stored = study.user_attrs.get(A.SETTINGS, {}).get("tracking_uri") or ""
    return stored if stored and "***" not in stored else default_tracking(workdir)


def _stored_config(a: argparse.Namespace, study: Any, workdir: Path, storage: str, **per_invocation: Any) -> Any:
    """The study's run settings, for another run on it (resume, rerun-front)."""
    from . import _attrs as A
    from ._settings import RunConfig

    stored = study.user_attrs.get(A.SETTINGS)
    if not stored or A.SPACE not in study.user_attrs:
        raise UsageError(f"study {a.study!r}: was not started by csweep run (no stored spec to run again)")
    if a.ray_address:
        check_ray_address(a.ray_address)
    tracking = _tracking_of(a, study, workdir)
    stored = {"space": study.user_attrs[A.SPACE], **stored, "tracking_uri": tracking}
    return RunConfig.from_stored(
        stored, source=f"<study {a.study}>", study_name=a.study, workers=a.workers, workdir=workdir,
        storage=storage, ray_address=a.ray_address, progress=not a.no_progress,
        artifact_root=artifact_root_for(tracking, workdir), **per_invocation)


def cmd_resume(a: argparse.Namespace) -> int:
    from . import _attrs as A
    from ._runner import fresh_seed_offset, prepare_resume, run_sweep, unfinished_reruns, write_study_reports
    from ._tracking import SafeTracker

    workdir, storage, study = _open_existing(a)
    cfg = _stored_config(a, study, workdir, storage, trials=0)
    mlflow = None
    if study.user_attrs.get(A.PARENT_RUN):
        mlflow = SafeTracker(cfg.tracking_uri, a.study, artifact_root=cfg.artifact_root)
    redo, remaining, attrs = prepare_resume(study, mlflow)
    if remaining == 0:
        out = write_study_reports(study, workdir, mlflow, study.user_attrs.get(A.PARENT_RUN))
        print(f"study {a.study}: nothing left to run ({len(study.trials)} trials); reports: {out}")
        return 0
    # an interrupted rerun-front goes on with seeds none of the study's trials used
    offset = fresh_seed_offset(study) if unfinished_reruns(study, attrs) else 0
    cfg = dataclasses.replace(cfg, trials=remaining, enqueue=redo, enqueue_attrs=attrs, seed_offset=offset)
    print(f"study {a.study}: resuming {remaining} trial(s), {len(redo)} of them re-runs of unfinished ones",
          file=sys.stderr)
    return _finish(run_sweep(cfg), workdir, a.tracking_uri, cfg.tracking_uri)


def cmd_rerun_front(a: argparse.Namespace) -> int:
    """The current front's configs again, each with K seeds none of its trials used."""
    workdir, storage, study = _open_existing(a)
    from reports import trials_frame, pareto_frame

    from . import _attrs as A
    from ._runner import fresh_seed_offset, run_sweep

    front = pareto_frame(study, trials_frame(study))
    if front.empty:
        raise UsageError(f"study {a.study!r}: its Pareto front is empty (no usable COMPLETE trial to re-train)")
    by_number = {t.number: t for t in study.trials}
    configs = [dict(by_number[int(n)].params) for n in front["trial"]]
    cfg = _stored_config(a, study, workdir, storage, trials=len(configs), enqueue=configs,
                         enqueue_attrs=[{A.RERUN_OF: int(n)} for n in front["trial"]],
                         seed_offset=fresh_seed_offset(study))
    cfg = dataclasses.replace(cfg, seeds=a.seeds, seed_plan="every")  # every front config gets its K seeds
    print(f"study {a.study}: re-training {len(configs)} front config(s) (trials "
          f"{', '.join(str(int(n)) for n in front['trial'])}) with {a.seeds} fresh seed(s) each", file=sys.stderr)
    study.set_user_attr(A.TARGET_TRIALS, int(study.user_attrs.get(A.TARGET_TRIALS, 0)) + len(configs))
    return _finish(run_sweep(cfg), workdir, a.tracking_uri, cfg.tracking_uri)


def cmd_sync(a: argparse.Namespace) -> int:
    from ._sync import sync_study

    workdir, _, study = _open_existing(a)
    tracking = _tracking_of(a, study, workdir)
    artifact_root = artifact_root_for(tracking, workdir)
    try:
        created, filled, already = sync_study(study, workdir, tracking, artifact_root=artifact_root)
    except UsageError:
        raise
    except Exception as exc:  # noqa: BLE001 - e.g. still unreachable: say so; what was synced stays synced
        print(f"csweep: sync to {_redacted(tracking)} stopped ({exc.__class__.__name__}: {str(exc)[:200]}); "
              "run it again once MLflow is reachable", file=sys.stderr)
        return 1
    print(f"study {a.study}: {created} runs created, {filled} back-filled, {already} already in MLflow")
    return 0


def _redacted(uri: str) -> str:
    from ._tracking import redact

    return redact(uri)


def cmd_report(a: argparse.Namespace) -> int:
    workdir, storage, study = _open_existing(a)
    studies = [study] + [_open_existing(a, name)[2] for name in a.others]
    from . import _attrs as A
    from ._runner import write_study_reports
    from ._tracking import SafeTracker

    for s in studies:
        parent = s.user_attrs.get(A.PARENT_RUN)
        tracking = _tracking_of(a, s, workdir)
        mlflow = SafeTracker(tracking, s.study_name, artifact_root=artifact_root_for(tracking, workdir)) if parent else None
        out = write_study_reports(s, workdir, mlflow, parent)
        print(f"reports: {out}")
        line = mlflow.unreachable_line(s.study_name, written="the local reports are written") if mlflow else ""
        if line:
            print(line, file=sys.stderr)
    if len(studies) > 1:
        from reports import data_mismatch, write_comparison

        out = workdir / "reports" / ("compare-" + "-vs-".join(s.study_name for s in studies))
        write_comparison(studies, out)
        print(f"comparison: {out}")
        mismatch = data_mismatch(studies)
        if mismatch:
            print(f"csweep: note: {mismatch}", file=sys.stderr)
    return 0


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


def cmd_ui(a: argparse.Namespace) -> int:
    workdir = Path(a.workdir).expanduser()
    tracking = a.tracking_uri or default_tracking(workdir)
    if a.tracking_uri is None and not (workdir / "mlflow.db").is_file():
        raise UsageError(f"--workdir {str(workdir)!r}: no mlflow.db there (run a sweep first)")
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", tracking,
           "--host", a.host, "--port", str(a.port), "--workers", str(a.workers)]
    if a.tracking_uri is None:
        cmd += ["--default-artifact-root", (workdir / "mlartifacts").resolve().as_uri()]
    import signal
    import subprocess

    # browsing training runs needs none of MLflow 3's GenAI job runners (a job process and a
    # pool of consumers, each importing MLflow: most of the UI's start-up); a user's own setting wins
    env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ}
    # the server and its worker processes in a process group of their own, which goes down with
    # this command however it ends (Ctrl-C, SIGTERM, the server's own exit): none is left on the port
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    terminated = []

    def on_sigterm(*_: Any) -> None:
        # the server's group is stopped and its wait returns: no exception is raised into whatever
        # runs when the signal lands (an import of MLflow's client once let it escape: exit -2)
        terminated.append(True)
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        code = _serve(proc, a, tracking)
        return 143 if terminated else code
    except KeyboardInterrupt:
        return 143 if terminated else 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        _stop_group(proc)


def _stop_group(proc: Any) -> None:
    """SIGTERM to the server's own process group (by its id), SIGKILL after 30 s."""
    import signal
    import subprocess

    if proc.poll() is not None and not _group_alive(proc.pid):
        return
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        if not _group_alive(proc.pid):
            return


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _serve(proc: Any, a: argparse.Namespace, tracking: str) -> int:
    """Wait for the UI's server to listen, print where it is, then wait for it to end."""
    import socket
    import time

    # say where it is once it accepts connections (seconds: MLflow imports itself first)
    while proc.poll() is None:
        try:
            with socket.create_connection((a.host, a.port), timeout=1):
                break
        except OSError:
            time.sleep(0.5)
    if proc.poll() is None:
        url = f"http://{a.host}:{a.port}"
        print(f"MLflow UI: {url}  (Ctrl-C to stop)", flush=True)
        # MLflow 3's UI opens experiments in its GenAI view unless told the workflow: link each
        # study's page of training runs
        try:
            from mlflow.tracking import MlflowClient

            for exp in MlflowClient(tracking_uri=tracking).search_experiments():
                if exp.name != "Default":
                    print(f"  {exp.name}: {url}/#/experiments/{exp.experiment_id}?workflowType=machine_learning",
                          flush=True)
        except Exception:  # noqa: BLE001 - the links are a convenience; the UI is up
            pass
    return proc.wait()


def cmd_pull(a: argparse.Namespace) -> int:
    """A trial's exports from its MLflow run into DIR (concepts/NAME/learned_embeds.safetensors,
    pytorch_lora_weights.safetensors, config.yaml), and the diffusers lines that load them."""
    target = Path(a.directory)
    if target.exists() and not target.is_dir():
        raise UsageError(f"pull: {str(target)!r} exists and is not a directory")
    workdir, _, study = _open_existing(a)
    from optuna.trial import TrialState

    from . import _attrs as A

    complete = {t.number: t for t in study.trials if t.state == TrialState.COMPLETE}
    if a.front:
        trials = sorted(study.best_trials, key=lambda t: t.number)
        if not trials:
            raise UsageError(f"pull: study {a.study!r} has no completed trial yet")
    else:
        if a.trial not in complete:
            known = ", ".join(map(str, sorted(complete))) or "none"
            raise UsageError(f"pull: study {a.study!r} has no completed trial {a.trial} (completed: {known})")
        trials = [complete[a.trial]]
    missing = [t.number for t in trials if not t.user_attrs.get(A.MLFLOW_RUN_ID)]
    if missing:
        raise UsageError(f"pull: trial {missing[0]} has no MLflow run yet (run `csweep sync {a.study}` first)")
    import mlflow.artifacts

    tracking = _tracking_of(a, study, workdir)
    import tempfile

    for t in trials:
        folder = target / f"trial-{t.number}" if a.front else target
        folder.mkdir(parents=True, exist_ok=True)
        run_id = t.user_attrs[A.MLFLOW_RUN_ID]
        with tempfile.TemporaryDirectory() as tmp:
            into = folder if a.format == "diffusers" else Path(tmp)
            try:
                names = {f.path for f in mlflow.MlflowClient(tracking).list_artifacts(run_id)}
                for path in ("concepts", "pytorch_lora_weights.safetensors", "config.yaml"):
                    if path in names:
                        mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=path, dst_path=str(into),
                                                            tracking_uri=tracking)
            except Exception as exc:  # noqa: BLE001 - MLflow unreachable or the run's artifacts gone
                print(f"csweep: pull: cannot read trial {t.number}'s run {run_id} from {_redacted(tracking)} "
                      f"({exc.__class__.__name__}: {str(exc)[:200]})", file=sys.stderr)
                return 1
            print(f"trial {t.number} -> {folder}")
            if a.format == "diffusers":
                print(_load_lines(folder))
                continue
            print(_write_kohya(into, folder, f"{study.study_name}-trial-{t.number}"))
    return 0


def _write_kohya(pulled: Path, folder: Path, prefix: str) -> str:
    """kohya's files (objectives._kohya) from a pulled diffusers folder, its config.yaml beside
    them; returns the lines that say where AUTOMATIC1111 and ComfyUI take them."""
    import shutil

    import yaml

    from objectives._kohya import write_kohya

    config = pulled / "config.yaml"
    alpha = None
    if config.is_file():
        alpha = (yaml.safe_load(config.read_text()) or {}).get("lora_alpha")
        shutil.copy(config, folder / "config.yaml")
    lines = []
    for path in write_kohya(pulled, folder, prefix=prefix, alpha=alpha):
        if path.stem == prefix:
            lines.append(f"  {path}: LoRA, into models/Lora (A1111: <lora:{prefix}:1> in the prompt) or "
                         "ComfyUI's models/loras (LoraLoader)")
        else:
            lines.append(f"  {path}: embedding, into embeddings/ (A1111 and ComfyUI: write {path.stem} in the "
                         f"prompt; ComfyUI: embedding:{path.stem})")
    return "\n".join(lines)


def _load_lines(folder: Path) -> str:
    """The diffusers code that loads a pulled trial into a pipeline `pipe` on the same base model
    (SDXL embeddings hold one row per text encoder, keys clip_l / clip_g)."""
    from safetensors import safe_open

    lines = []
    concepts = sorted(p for p in (folder / "concepts").iterdir() if p.is_dir()) if (folder / "concepts").is_dir() else []
    for concept in concepts:
        token, path = f"<{concept.name}>", str(concept / "learned_embeds.safetensors")
        with safe_open(path, framework="numpy") as f:
            sdxl = "clip_g" in f.keys()
        if sdxl:
            lines.append(f"state = safetensors.torch.load_file({path!r}); "
                         f"pipe.load_textual_inversion(state['clip_l'], token={token!r}, "
                         "text_encoder=pipe.text_encoder, tokenizer=pipe.tokenizer); "
                         f"pipe.load_textual_inversion(state['clip_g'], token={token!r}, "
                         "text_encoder=pipe.text_encoder_2, tokenizer=pipe.tokenizer_2)")
        else:
            lines.append(f"pipe.load_textual_inversion({str(concept)!r}, token={token!r})")
    if (folder / "pytorch_lora_weights.safetensors").is_file():
        lines.append(f"pipe.load_lora_weights({str(folder)!r})")
    return "\n".join(f"  {line}" for line in lines)


def cmd_export_model(a: argparse.Namespace) -> int:
    target = Path(a.directory)
    if target.exists() and any(target.iterdir()):
        raise UsageError(f"export-model: {str(target)!r} exists and is not empty")
    from objectives import export_model

    export_model(a.model, target)
    print(f"wrote {a.model} model to {target}")
    return 0


COMMANDS = {
    "run": cmd_run, "report": cmd_report, "resume": cmd_resume, "rerun-front": cmd_rerun_front,
    "sync": cmd_sync, "spaces": cmd_spaces, "params": cmd_params,
    "ui": cmd_ui, "export-model": cmd_export_model, "pull": cmd_pull,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except UsageError as exc:
        print(f"csweep: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("csweep: interrupted", file=sys.stderr)
        return 130


def cli() -> None:
    """Console-script entry point."""
    rc = main()
    # the process ends here: objects still alive are moved out of the collector's reach, so
    # that exiting skips a last full collection of a heap that holds MLflow, pandas and
    # SQLAlchemy (about 2 s of a sweep's exit on two cores); atexit handlers still run
    import gc

    gc.freeze()
    sys.exit(rc)
