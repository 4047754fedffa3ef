"""The samplers `csweep run --sampler` offers, each as one record: its Optuna sampler, and what it
supports, checked in one place (check_sampler) before anything runs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SamplerSpec:
    name: str
    # (seed, trials in flight, the declared pairs, the Sobol scramble seed) -> an Optuna sampler
    factory: Callable[[int | None, int, Sequence[tuple[str, str]], int | None], Any]
    in_flight: str  # what it does with trials in flight
    sobol: bool = False  # draws a scrambled Sobol sequence (the study keeps its scramble seed)
    hypotheses: bool = False  # aims its trials at the space's declared pairs
    constraints: bool = False  # reads the memory budget's constraint (trial.set_constraint)
    design_seeds: bool = False  # spends --seeds K as a design (--seed-plan design: seeds_for)
    min_params: int = 1  # sampled params it needs
    why_min: str = ""


def _tpe(seed, workers, pairs, qmc_seed):  # noqa: ANN001, ANN202, ARG001
    import optuna

    return optuna.samplers.TPESampler(seed=seed, constant_liar=workers > 1, multivariate=True)


def _nsga2(seed, workers, pairs, qmc_seed):  # noqa: ANN001, ANN202, ARG001
    import optuna

    return optuna.samplers.NSGAIISampler(seed=seed)


def _gp(seed, workers, pairs, qmc_seed):  # noqa: ANN001, ANN202, ARG001
    import optuna

    return optuna.samplers.GPSampler(seed=seed)


def _random(seed, workers, pairs, qmc_seed):  # noqa: ANN001, ANN202, ARG001
    import optuna

    return optuna.samplers.RandomSampler(seed=seed)


def _qmc(seed, workers, pairs, qmc_seed):  # noqa: ANN001, ANN202, ARG001
    import optuna

    return optuna.samplers.QMCSampler(qmc_type="sobol", scramble=True, seed=seed if qmc_seed is None else qmc_seed,
                                      warn_independent_sampling=False)


def _coupling(seed, workers, pairs, qmc_seed):  # noqa: ANN001, ANN202, ARG001
    from ._coupling_sampler import CouplingSampler

    return CouplingSampler(pairs=pairs, seed=seed, qmc_seed=qmc_seed)


SAMPLER_SPECS: dict[str, SamplerSpec] = {s.name: s for s in (
    SamplerSpec("tpe", _tpe, "the constant liar: each in flight counts as a poor result", constraints=True),
    SamplerSpec("nsga2", _nsga2, "a generation's trials are drawn independently", constraints=True),
    SamplerSpec("gp", _gp, "ignored: each trial is drawn from the finished ones", constraints=True),
    SamplerSpec("random", _random, "independent draws"),
    SamplerSpec("qmc", _qmc, "the next points of one Sobol sequence", sobol=True),
    SamplerSpec("coupling", _coupling, "its boundary trials keep away from those in flight", sobol=True,
                hypotheses=True, design_seeds=True, min_params=2, why_min="a coupling design needs two or more"),
)}
SAMPLERS = tuple(SAMPLER_SPECS)


def sampler_spec(name: str) -> SamplerSpec:
    try:
        return SAMPLER_SPECS[name]
    except KeyError:
        raise ValueError(f"sampler {name!r} is unknown (valid: {', '.join(SAMPLERS)})") from None


def make_sampler(name: str, *, seed: int | None, workers: int, pairs: Sequence[tuple[str, str]] = (),
                 qmc_seed: int | None = None) -> Any:
    """A sampler by name. qmc is Optuna's scrambled Sobol design (space-filling: the standard
    design for sensitivity studies); coupling starts with it and then aims at the `pairs`
    (sweeps._coupling_sampler). `qmc_seed`: the Sobol sequence's scramble seed (the study's own,
    common.attrs.QMC_SEED) [seed]."""
    import warnings

    import optuna

    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return sampler_spec(name).factory(seed, workers, list(pairs), qmc_seed)


def check_sampler(name: str, *, source: str, params: int, seed_plan: str, seeds: int) -> str | None:
    """Why this run cannot use the sampler (one line naming the flag and the rule), or None."""
    spec = sampler_spec(name)
    if params < spec.min_params:
        return f"--sampler {name}: {source} samples {params} param; {spec.why_min}"
    if seed_plan == "design" and not spec.design_seeds:
        users = ", ".join(s.name for s in SAMPLER_SPECS.values() if s.design_seeds)
        return f"--seed-plan design: the coupling design spends the seeds; use it with --sampler {users}, not {name}"
    if seed_plan == "design" and seeds < 2:
        return f"--seed-plan design: --seeds K is the runs per trial to spend; it needs K >= 2, got {seeds}"
    return None
