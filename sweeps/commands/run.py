"""`csweep run SPACE`: a sweep over a search space (or, with --dry-run, a memory probe of it)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from .._rungs import DEFAULT_RUNGS_TEXT
from .._samplers import SAMPLERS, check_sampler, sampler_spec
from .._study import OBJECTIVES
from ._options import (
    UsageError,
    absolute_sqlite,
    add_store_options,
    artifact_root_for,
    check_ray_address,
    check_storage_url,
    check_tracking_uri,
    default_storage,
    default_tracking,
    finish,
    positive_float,
    positive_int,
    redacted,
)
from ._run_checks import (
    check_curve_options,
    check_model,
    check_objective_params,
    load_checked_space,
    model_family,
    objective_names,
    parse_overrides,
    sample_settings,
)

DEFAULT_OBJECTIVE = "textual_inversion"
DEFAULT_TRIALS = 20


def add_parser(sub: Any) -> None:
    run = sub.add_parser("run", help="run a sweep over a search space")
    run.add_argument("space", help="a built-in space name (csweep spaces) or a YAML file")
    run.add_argument("--trials", type=positive_int("--trials"), help="trials to add [the space's, else 20]")
    run.add_argument("--workers", type=positive_int("--workers"), default=1, help="trials in flight [1]")
    run.add_argument("--study", help="study name [the space's name]")
    add_store_options(run)
    run.add_argument("--ray-address", help="join a running Ray cluster [start a local one]")
    run.add_argument("--sampler", choices=SAMPLERS, default="tpe")
    run.add_argument("--seed", type=int, help="sampler seed: the same seed samples the same sequence")
    run.add_argument("--until-decisive", action="store_true",
                     help="stop once every hypothesis (with none declared, every pair) has a decided "
                          "coupling verdict; --trials is the budget")
    run.add_argument("--seeds", type=positive_int("--seeds"), default=1,
                     help="train every sampled config with K seeds; its val_loss is their mean [1]")
    run.add_argument("--seed-plan", choices=("every", "design"), default="every",
                     help="every: each config trains --seeds K seeds; design (--sampler coupling): --trials x K "
                          "training runs, K seeds on each config of the design's space-filling start (the "
                          "noise floor), one on each config after it [every]")
    run.add_argument("--model", default="tiny",
                     help="tiny, tiny-sdxl, random:sd15, random:sdxl (the real architectures, seeded random "
                          "weights: for --dry-run), a local diffusers folder, or an SD 1.x / SDXL single-file "
                          "checkpoint (.safetensors, the original layout) [tiny]")
    run.add_argument("--allow-pickle", action="store_true",
                     help="let --model be a pickle checkpoint (.ckpt): unpickled once (it can run code: only "
                          "files you trust) and converted to .safetensors in the cache")
    run.add_argument("--profile", choices=("tiny", "sd15", "sdxl"),
                     help="the space's ranges for this model family [from --model: tiny for the tiny models, "
                          "sdxl for a folder with text_encoder_2, else sd15]")
    run.add_argument("--data", help="folder of concept images [synthetic concepts]")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                     help="override a fixed parameter (repeatable)")
    run.add_argument("--objective", help="built-in name or module:function [the space's]")
    run.add_argument("--max-mem-mb", type=positive_float("--max-mem-mb"),
                     help="memory budget; trials above it are infeasible")
    run.add_argument("--cpus-per-trial", type=positive_float("--cpus-per-trial"),
                     help="[the CPUs shared among the trials in flight]; torch threads follow it")
    run.add_argument("--gpus-per-trial", type=positive_float("--gpus-per-trial", zero_ok=True),
                     help="each trial's GPU share; when not given, trials are packed onto the GPUs by their "
                          "predicted peak memory (--gpu-mem-mb)")
    run.add_argument("--gpu-mem-mb", type=positive_float("--gpu-mem-mb"),
                     help="MB per GPU that the trials in flight on it may hold together: as many trials run on "
                          "a GPU as their predicted peaks fit [the card's memory]; --workers caps them")
    run.add_argument("--max-retries", type=int, default=1,
                     help="re-runs of a trial whose worker process died [1]")
    run.add_argument("--max-fail-share", type=positive_float("--max-fail-share"), default=0.5,
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
    run.add_argument("--samples", type=positive_int("--samples"), metavar="N",
                     help="sample images per prompt and concept after each trial [the space's, else 2]")
    run.add_argument("--no-samples", action="store_true", help="draw no sample images")
    run.add_argument("--fidelity-model", metavar="PATH",
                     help="local CLIP or DINO folder that scores the samples' concept fidelity "
                          "[the base model's own VAE]")
    run.add_argument("--objectives", default=",".join(OBJECTIVES), metavar="LIST",
                     help="the study's objectives: val_loss,peak_mem_mb and optionally fidelity "
                          "(maximized; needs samples) [val_loss,peak_mem_mb]")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument("--dry-run", type=positive_int("--dry-run"), metavar="N",
                     help="train N of the space's configs for 2 steps each here, print their peak memory and "
                          "step time (flagging those above --max-mem-mb), and add nothing to any study")
    run.set_defaults(handler=cmd_run)


def cmd_run(a: argparse.Namespace) -> int:
    cfg = run_config(a)
    if cfg.early_stop == "dominated" and (cfg.until_decisive or sampler_spec(cfg.sampler).hypotheses) \
            and not any(p.name == "steps" for p in cfg.space.params):
        print("csweep: note: --early-stop dominated keeps the trials it stops out of the coupling fits (`steps` "
              f"is not sampled), so {'--until-decisive' if cfg.until_decisive else '--sampler ' + cfg.sampler} has fewer "
              "trials to decide with; leave it off for a coupling question", file=sys.stderr)
    if cfg.max_mem_mb is not None and not sampler_spec(cfg.sampler).constraints:
        print(f"csweep: note: --sampler {cfg.sampler} does not read the memory budget when it proposes a config; "
              "trials above --max-mem-mb are still marked infeasible and kept off the front", file=sys.stderr)
    if a.dry_run:
        from ._dry_run import dry_run

        return dry_run(cfg, a.dry_run)
    from .._runner import run_sweep
    from .._study import StudyMismatch, make_storage, mismatch

    if a.storage or Path(default_storage(cfg.workdir).removeprefix("sqlite:///")).exists():
        try:
            why = mismatch(make_storage(cfg.storage), cfg.study_name, cfg.objectives)
        except Exception as exc:  # noqa: BLE001 - an unreachable database is bad input
            raise UsageError(f"--storage {redacted(cfg.storage)}: cannot connect ({exc.__class__.__name__})") from None
        if why:
            raise UsageError(why)
    cfg.workdir.mkdir(parents=True, exist_ok=True)
    try:
        out = run_sweep(cfg)
    except StudyMismatch as exc:
        raise UsageError(str(exc)) from None
    return finish(out, cfg.workdir, a.tracking_uri, cfg.tracking_uri)


# --- commands ----------------------------------------------------------------------------
def run_config(a: argparse.Namespace) -> Any:
    """Every `run` option, checked, as the run's settings record (sweeps._settings.RunConfig);
    nothing written."""
    from objectives import HealthConfig, check_data_dir, check_plugin_importable, get_objective

    from .._settings import RunConfig

    space = load_checked_space(a.space)
    model = check_model(a.model, allow_pickle=a.allow_pickle)
    family = a.profile or model_family(model)
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
    check_objective_params(space, fixed, objective, model)
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
    err = check_sampler(a.sampler, source=space.source, params=len(space.params), seed_plan=a.seed_plan,
                        seeds=a.seeds)
    if err:
        raise UsageError(err)
    if a.until_decisive and len(space.params) < 2:
        raise UsageError(f"--until-decisive: {space.source} samples {len(space.params)} param, so there is no "
                         "pair to decide; sample two or more")
    workdir = Path(a.workdir).expanduser()
    storage = a.storage or default_storage(workdir)
    if a.storage:
        check_storage_url(storage)
    tracking = a.tracking_uri or default_tracking(workdir)
    check_tracking_uri(tracking)
    storage, tracking = absolute_sqlite(storage), absolute_sqlite(tracking)
    return RunConfig(
        space=space, study_name=a.study or space.name, trials=a.trials or space.trials or DEFAULT_TRIALS,
        workers=a.workers, workdir=workdir, storage=storage, tracking_uri=tracking,
        objective=objective_name, builtin=objective.builtin, fixed=fixed, model=model,
        data=str(Path(a.data).resolve()) if a.data else None, sampler=a.sampler, seed=a.seed, seeds=a.seeds,
        seed_plan=a.seed_plan, trials_are_runs=a.seed_plan == "design",
        until_decisive=a.until_decisive, score=a.score, early_stop=a.early_stop or "", rungs=rungs,
        profile=space.profile,
        ray_address=a.ray_address, cpus_per_trial=a.cpus_per_trial, gpus_per_trial=a.gpus_per_trial,
        gpu_mem_mb=a.gpu_mem_mb,
        max_mem_mb=a.max_mem_mb, health=health, samples=samples, progress=not a.no_progress,
        max_retries=a.max_retries, max_fail_share=a.max_fail_share, objectives=objectives,
        artifact_root=artifact_root_for(tracking, workdir),
    )
