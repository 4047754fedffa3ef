"""The analyses judged on synthetic objectives with known truth, across many seeded studies:
null (additive) objectives, planted couplings, planted laws, seed noise."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from synthetic import (
    FREEZE_CENTRES,
    ISHIGAMI_RANGE,
    ISHIGAMI_S2,
    LAW_SPACE,
    UNIT_SPACE,
    categorical_study,
    coupling_study,
    frame,
    g_exact,
    g_function,
    ishigami,
    moderate_study,
    pair_shares,
    power_law_study,
    with_unsettled_runs,
)

from reports import converged, coupling_analysis, fit_power_law, front_probability, noise_floor

STUDIES = range(20)
TRUE_ALPHA = -0.35


@pytest.mark.slow
def test_an_additive_objective_with_noise_is_never_called_coupled():
    called = [s for s in STUDIES
              if any(c.ci_low > 0.05 for c in coupling_analysis(coupling_study(s, coupled=False), UNIT_SPACE,
                                                                 n_boot=20, seed=s))]
    assert len(called) <= 1, called  # at least 19 of 20 studies call no pair coupled


@pytest.mark.slow
def test_a_planted_coupling_with_noise_is_ranked_first_and_called_coupled():
    for s in STUDIES:
        out = coupling_analysis(coupling_study(s, coupled=True), UNIT_SPACE, n_boot=20, seed=s)
        assert {out[0].param_a, out[0].param_b} == {"warm", "sigma"}, s
        assert out[0].verdict_key == "coupled", (s, out[0])
        assert all(c.verdict_key == "no sign of coupling" for c in out[1:]), s


def _right(out, coupled: bool) -> bool:
    """The verdicts a planted warm x sigma coupling (or none) should get."""
    if not coupled:
        return not any(c.ci_low > 0.05 for c in out)
    return ({out[0].param_a, out[0].param_b} == {"warm", "sigma"} and out[0].verdict_key == "coupled"
            and all(c.verdict_key == "no sign of coupling" for c in out[1:]))


@pytest.mark.slow
def test_one_run_that_never_settled_does_not_decide_the_coupling():
    """One `degrading` trial in 60, its val_loss far above the rest: kept in the fit it carries
    most of the variance and a wrong pair is called coupled; the report's fit leaves it out."""
    kept_right, raw_wrong = [], []
    for s in range(6):
        for coupled in (True, False):
            df = with_unsettled_runs(coupling_study(s, coupled=coupled), s)
            assert len(converged(df)) == len(df) - 1
            kept_right.append(_right(coupling_analysis(converged(df), UNIT_SPACE, n_boot=20, seed=s), coupled))
        if s < 4:
            raw = with_unsettled_runs(coupling_study(s, coupled=True), s)
            raw_wrong.append(not _right(coupling_analysis(raw, UNIT_SPACE, n_boot=20, seed=s), True))
    assert sum(kept_right) >= 11, kept_right  # planted and null, 6 studies each (20 each above)
    assert sum(raw_wrong) >= 3, raw_wrong  # the harm is real: fitted as they are, most go wrong


@pytest.mark.slow
def test_a_planted_exponent_is_recovered_within_0_1_without_noise():
    fits = [fit_power_law(power_law_study(s), "W", "sigma", params=LAW_SPACE, n_boot=10) for s in STUDIES]
    close = [abs(f.alpha - TRUE_ALPHA) < 0.1 for f in fits]
    assert sum(close) >= 18, [round(f.alpha, 3) for f in fits]
    widths = [f.alpha_ci_high - f.alpha_ci_low for f in fits]
    assert np.median(widths) < 0.1, widths  # the per-bin fit's intervals were 0.3-0.9 wide


@pytest.mark.slow
def test_a_planted_exponents_95_interval_covers_the_truth_under_noise():
    fits = [fit_power_law(power_law_study(s, noise=0.05), "W", "sigma", params=LAW_SPACE, n_boot=20)
            for s in STUDIES]
    covered = [f.alpha_ci_low <= TRUE_ALPHA <= f.alpha_ci_high for f in fits]
    assert sum(covered) >= 18, [(round(f.alpha_ci_low, 3), round(f.alpha_ci_high, 3)) for f in fits]
    # and the verdicts on the folk rules follow: both alpha = -0.5 and +0.5 are excluded
    assert all(f.excludes(-0.5) and f.excludes(0.5) for f in fits)


def test_a_planted_law_is_recovered_with_its_interval_in_one_study():
    fit = fit_power_law(power_law_study(1, noise=0.05), "W", "sigma", params=LAW_SPACE, n_boot=10)
    assert fit.alpha_ci_low <= TRUE_ALPHA <= fit.alpha_ci_high and abs(fit.alpha - TRUE_ALPHA) < 0.05
    assert "alpha = -0.5 is excluded" in fit.sentence() and "alpha = +0.5 is excluded" in fit.sentence()


def test_categorical_knobs_enter_the_coupling_analysis():
    df = categorical_study(0)
    out = coupling_analysis(df, {"lr": {"low": 1e-4, "high": 1e-1, "log": True}, "decay": {"low": 0, "high": 1}},
                            categorical={"freeze": list(FREEZE_CENTRES), "targets": ["unet", "text"],
                                         "init_from": ["random", "word:cat"]}, n_boot=10)
    by_pair = {frozenset((c.param_a, c.param_b)): c for c in out}
    freeze_lr = by_pair[frozenset(("freeze", "lr"))]
    assert freeze_lr.kind == "categorical x numeric" and freeze_lr.param_a == "freeze"
    assert freeze_lr.verdict_key == "coupled"
    cat_cat = by_pair[frozenset(("targets", "init_from"))]
    assert cat_cat.kind == "categorical x categorical" and cat_cat.verdict_key == "coupled"
    assert by_pair[frozenset(("decay", "lr"))].verdict_key == "no sign of coupling"
    assert by_pair[frozenset(("freeze", "decay"))].verdict_key == "no sign of coupling"
    # the best lr per freeze mode, with its interval, lands on the planted one
    best = {level: (b, lo, hi) for level, b, lo, hi in freeze_lr.best_by_level}
    for mode, centre in FREEZE_CENTRES.items():
        b, lo, hi = best[mode]
        assert abs(math.log10(b) - centre) < 0.35, (mode, b)
        assert lo <= b <= hi
    assert "Best lr per freeze" in freeze_lr.sentence()


def test_noise_floor_pools_within_config_replicates():
    df = power_law_study(0, noise=0.2, n=60, n_seeds=4)
    floor = noise_floor(df)
    assert floor.std == pytest.approx(0.2) and floor.dof == 60 * 3
    assert noise_floor(power_law_study(0, n=30)).std is None
    assert "not measured" in noise_floor(power_law_study(0, n=30)).sentence()


def test_a_score_whose_spread_is_within_its_seed_noise_is_flagged():
    """The demo's figures: fidelity spreads 0.087 across configs against a seed noise of 0.122;
    val_loss spreads 0.0109 against 0.0038."""
    from reports import NoiseFloor

    weak = NoiseFloor(0.122, 18, 18, "fidelity").sentence(0.087)
    assert "0.7x the seed noise" in weak and "within seed noise" in weak and "--samples N" in weak
    strong = NoiseFloor(0.0038, 18, 18).sentence(0.0109)
    assert "2.9x the seed noise" in strong and "within seed noise" not in strong


def test_front_probability_reflects_the_noise():
    df = power_law_study(0, n=6)
    df["val_loss"] = [1.0, 1.001, 2.0, 3.0, 3.5, 4.0]
    df["peak_mem_mb"] = [10.0, 9.0, 5.0, 4.0, 6.0, 1.0]
    # without measured noise, the front is certain
    assert front_probability(df, [0, 1, 2, 3, 5]) == [1.0] * 5
    df["n_seeds"], df["val_loss_std"] = 3, 0.05
    df["val_loss_sem"] = 0.05 / math.sqrt(3)
    p = dict(zip([0, 1, 2, 3, 5], front_probability(df, [0, 1, 2, 3, 5])))
    assert p[2] > 0.99 and p[5] > 0.99  # far apart: certain
    assert 0.3 < p[0] < 0.9  # 0.001 better than #1 at more memory: within noise


def test_the_analysis_quadrature_gives_published_interaction_shares_within_a_tenth_of_the_line():
    """The variance over the space is taken on the analysis's quadrature (common.gp.quadrature):
    with the true function in place of the surrogate, every pair's share of Ishigami and of
    Sobol's G lies within 0.005 (a tenth of the 5% line) of its published value. The 12 equally
    weighted midpoints it replaced put Ishigami's S13 at 0.227 against 0.2437."""
    from common.gp import quadrature

    nodes, weights = quadrature(None)
    assert weights.sum() == pytest.approx(1.0)
    for f, (lo, hi), published in ((ishigami, ISHIGAMI_RANGE, ISHIGAMI_S2), (g_function, (0.0, 1.0), g_exact())):
        shares = pair_shares(f, lo, hi, nodes[:, 0], weights)
        for pair, truth in published.items():
            assert abs(shares[pair] - truth) < 0.005, (f.__name__, pair, shares[pair], truth)


@pytest.mark.slow
@pytest.mark.parametrize("n", [30, 60, 100])
def test_on_a_noise_free_smooth_function_the_interval_holds_the_published_share(n):
    """Ishigami (S13 = 0.2437, S12 = S23 = 0), no noise, 10 seeded random designs per size: the
    95% interval of S13 holds it in most studies and misses it, where it does, by less than 0.01
    (a fifth of the 5% line); the zero pairs are never called coupled. Measured (benchmarks/
    side_by_side.py): 8, 10 and 7 of 10 at 30, 60 and 100 trials, every miss within 0.007 (the
    surrogate's edges: a stationary kernel flattens x3^4 where the trials thin out)."""
    covered, misses = 0, []
    for s in range(10):
        rng = np.random.default_rng(s)
        u = rng.random((n, 3))
        lo, hi = ISHIGAMI_RANGE
        y = ishigami(*(lo + (hi - lo) * u).T)
        df = frame({k: u[:, i] for i, k in enumerate(("x1", "x2", "x3"))}, y)
        out = {frozenset((c.param_a, c.param_b)): c
               for c in coupling_analysis(df, {k: {"low": 0.0, "high": 1.0} for k in ("x1", "x2", "x3")}, seed=s)}
        c13 = out[frozenset(("x1", "x3"))]
        truth = ISHIGAMI_S2[(0, 2)]
        covered += c13.ci_low <= truth <= c13.ci_high
        misses += [max(c13.ci_low - truth, truth - c13.ci_high, 0.0)]
        assert not out[frozenset(("x1", "x2"))].verdict_key == "coupled", s
        assert not out[frozenset(("x2", "x3"))].verdict_key == "coupled", s
    assert covered >= 7, (covered, misses)
    assert max(misses) < 0.01, misses


def _verdicts(out):
    return {frozenset((c.param_a, c.param_b)): c.verdict_key for c in out}


@pytest.mark.slow
@pytest.mark.parametrize("n", [10, 20, 30])
def test_at_the_sizes_users_run_no_verdict_is_wrong(n):
    """The moderate planting of the issue (one pair's pure interaction 12% of the noise-free
    variance, the configs' spread 2.8x the seed noise, an additive pair beside it), random
    designs, 20 seeded studies per size: the planted pair is never called "no sign" more than
    once, and neither an additive pair nor any pair of the same objective without the
    interaction is ever called coupled more than once; what the trials cannot decide is
    inconclusive, with how many more trials would likely decide it."""
    planted_no_sign, additive_coupled, null_coupled, decided_right = [], [], [], 0
    for s in STUDIES:
        got = _verdicts(coupling_analysis(moderate_study(s, n=n), UNIT_SPACE, seed=s))
        planted = got[frozenset(("warm", "sigma"))]
        planted_no_sign += [s] if planted.startswith("no sign") else []
        additive_coupled += [s] if got[frozenset(("lr", "decay"))] == "coupled" else []
        decided_right += planted == "coupled"
        null = coupling_analysis(moderate_study(s, n=n, coupled=False), UNIT_SPACE, seed=s)
        null_coupled += [s] if any(c.verdict_key == "coupled" for c in null) else []
        for c in null:
            if not c.decided:
                assert c.more_trials is not None and "more trials" in c.verdict(), c
    assert len(planted_no_sign) <= 1, planted_no_sign
    assert len(additive_coupled) <= 1, additive_coupled
    assert len(null_coupled) <= 1, null_coupled
    if n >= 30:
        assert decided_right >= 3  # random designs at 30 trials: 5 of 20 measured (benchmarks/RESULTS.md)


@pytest.mark.slow
def test_categorical_couplings_are_decided_at_30_trials_and_nothing_else_is_called_coupled():
    params = {"lr": {"low": 1e-4, "high": 1e-1, "log": True}, "decay": {"low": 0, "high": 1}}
    cats = {"freeze": list(FREEZE_CENTRES), "targets": ["unet", "text"], "init_from": ["random", "word:cat"]}
    planted = {frozenset(("freeze", "lr")), frozenset(("targets", "init_from"))}
    right = 0
    for s in range(10):
        got = _verdicts(coupling_analysis(categorical_study(s, n=30, noise=0.3), params, categorical=cats, seed=s))
        for pair, verdict in got.items():
            if pair in planted:
                assert not verdict.startswith("no sign"), (s, pair)
                right += verdict == "coupled"
            else:
                assert verdict != "coupled", (s, pair)
    assert right >= 16  # of 20 (19 measured)


@pytest.mark.slow
@pytest.mark.parametrize("n", [20, 40])
def test_a_law_interval_covers_the_truth_at_small_studies(n):
    fits = [fit_power_law(power_law_study(s, n=n, noise=0.05), "W", "sigma", params=LAW_SPACE, seed=s)
            for s in STUDIES]
    stated = [f for f in fits if math.isfinite(f.alpha)]
    covered = [f.alpha_ci_low <= TRUE_ALPHA <= f.alpha_ci_high for f in stated]
    assert sum(covered) >= 18, [(round(f.alpha_ci_low, 2), round(f.alpha_ci_high, 2)) for f in stated]
    assert len(stated) - sum(covered) <= 2


def test_no_law_is_stated_from_fewer_points_than_a_fit_can_bear():
    """The demo's law read alpha = 4.70 [-0.29, 7.50] from 3 points: with the best y on the edge of
    its range at most x, there is no law, and the sentence says why."""
    df = power_law_study(0, n=150, noise=0.05)
    narrow = {**LAW_SPACE, "sigma": {"low": 0.2, "high": 1.0, "log": True}}  # the optimum lies below
    df = df[df["sigma"] >= 0.2]
    fit = fit_power_law(df, "W", "sigma", params=narrow, seed=0)
    assert not math.isfinite(fit.alpha)
    assert "widen the range of sigma" in fit.sentence()


def test_the_advice_says_what_to_do():
    from reports import Coupling

    coupled = Coupling("lr", "lora_rank", 0.3, 0.12, 0.5, 30, best_path=((1e-3, 2.0), (1e-2, 8.0)))
    assert coupled.advice() == ("Tune lr and lora_rank together: the best lora_rank moves from 2 at lr=0.001 "
                                "to 8 at lr=0.01.")
    alone = Coupling("lr", "init_std", 0.004, 0.0, 0.021, 30)
    assert alone.advice().startswith("Tune lr and init_std one at a time") and "2.1%" in alone.advice()
    unsure = Coupling("lr", "init_std", 0.04, 0.002, 0.2, 20, more_trials=25)
    assert unsure.verdict() == "inconclusive: about 25 more trials would likely decide it"
    by_level = Coupling("freeze", "lr", 0.3, 0.1, 0.4, 30, "categorical x numeric",
                        (("embedding_only", 1e-3, 5e-4, 2e-3), ("full", 3e-2, 1e-2, 5e-2)))
    assert "the best lr is 0.001 with freeze=embedding_only, 0.03 with freeze=full" in by_level.advice()


# --- steps as data: a trial's curve as observations at every validated step ------------------
def _steps_fit(seed: int, *, n: int, alpha: float, curves: bool):
    from reports._analysis import fit_surrogate
    from reports._tables import curve_rows
    from synthetic import STEPS_SPACE, steps_study

    fit, kept = steps_study(seed, n=n, alpha=alpha)
    rows = curve_rows(fit, kept, STEPS_SPACE["steps"]) if curves else fit
    gp = fit_surrogate(rows, STEPS_SPACE, {}, n_hyper=20, seed=seed)
    law = fit_power_law(fit, "steps", "lr", params=STEPS_SPACE, gp=gp, n_boot=20, seed=seed)
    pair = [c for c in coupling_analysis(fit, STEPS_SPACE, gp=gp, n_boot=20, seed=seed)
            if {c.param_a, c.param_b} == {"steps", "lr"}][0]
    return law, pair


@pytest.mark.slow
def test_curves_as_observations_of_steps_keep_the_law_honest_and_narrow_it():
    """With `steps` sampled, each trial's validations are observations at their steps, its seed
    noise shared by its whole curve (an offset per trial in the surrogate). Planted: the best lr
    falls as steps^-0.5. At 20 trials, over 20 seeded studies, the law is stated in every one and its
    interval covers the truth in at least 18 (18 measured; from the trials' last points alone: stated
    in 17, covering in 17), at less than 0.6x the width (0.26 against 0.64 measured)."""
    with_curves = [_steps_fit(s, n=20, alpha=-0.5, curves=True) for s in STUDIES]
    finals = [_steps_fit(s, n=20, alpha=-0.5, curves=False) for s in STUDIES]
    stated = [law for law, _ in with_curves if law.stated]
    covered = sum(law.alpha_ci_low <= -0.5 <= law.alpha_ci_high for law in stated)
    assert len(stated) == 20 and covered >= 18, [(law.alpha_ci_low, law.alpha_ci_high) for law in stated]
    width = lambda fits: np.median([f.alpha_ci_high - f.alpha_ci_low for f, _ in fits if f.stated])  # noqa: E731
    assert width(with_curves) < 0.6 * width(finals)
    assert all(c.verdict_key == "coupled" for _, c in with_curves)


@pytest.mark.slow
def test_curves_as_observations_do_not_invent_a_coupling_of_steps():
    """The same study with the best lr independent of steps (alpha = 0): the points of one curve
    are correlated through the trial's seed noise, and read as independent they would call the
    pair coupled; with the per-trial offset, steps x lr is called coupled in at most 1 of 20 (0
    measured, "no sign" in 20), and no law is stated."""
    fits = [_steps_fit(s, n=20, alpha=0.0, curves=True) for s in STUDIES]
    assert sum(c.verdict_key == "coupled" for _, c in fits) <= 1, [c.verdict() for _, c in fits]
    assert sum(law.stated for law, _ in fits) <= 1


def test_the_advice_names_values_the_knobs_can_take():
    """The demo's advice read "lora_rank=0.333 ... 7.67" (the surrogate's grid points): an int
    knob's values are whole numbers inside its range, a stepped knob's lie on its step."""
    import optuna

    from reports import numeric_params

    def objective(t):
        rank = t.suggest_int("lora_rank", 0, 8)
        warm = t.suggest_int("warmup_steps", 0, 100, step=10)
        lr = t.suggest_float("lr", 1e-4, 1e-1, log=True)
        best = -3.5 + 0.25 * rank  # the best log10(lr) moves with the rank
        return (math.log10(lr) - best) ** 2 + 1e-4 * warm

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    study.optimize(objective, n_trials=60)
    ok = frame({k: np.array([t.params[k] for t in study.trials]) for k in ("lora_rank", "warmup_steps", "lr")},
               np.array([t.value for t in study.trials]))
    out = {frozenset((c.param_a, c.param_b)): c for c in coupling_analysis(ok, numeric_params(study), seed=0)}
    pair = out[frozenset(("lora_rank", "lr"))]
    assert pair.ci_low > 0.05, pair.sentence()
    assert [dict(zip((pair.param_a, pair.param_b), p))["lora_rank"] for p in pair.best_path] == [0, 8], pair.best_path
    assert pair.advice().endswith(" at lora_rank=8."), pair.advice()
    stepped = out[frozenset(("lora_rank", "warmup_steps"))]
    for p in stepped.best_path:
        by = dict(zip((stepped.param_a, stepped.param_b), p))
        assert by["warmup_steps"] % 10 == 0 and by["lora_rank"] % 1 == 0, stepped.best_path


DEMO_SPACE = {"lora_rank": {"low": 0, "high": 8, "log": False, "step": 2},
              "lr": {"low": 1e-3, "high": 1e-1, "log": True, "step": None},
              "init_std": {"low": 1e-3, "high": 1.0, "log": True, "step": None}}


def test_a_verdict_on_the_demos_trials_does_not_hang_on_the_analysis_seed():
    """The demo's 35 usable trials (`csweep run demo --seeds 2 --sampler random --seed 0`, saved):
    the three high-lr trials that rose most happen to have a high init_std too, so the
    hyperparameters' posterior has two modes (lr's steep main effect; an lr x init_std
    interaction). One chain stayed in the mode it met first, and the report's seed decided the
    verdict: "coupled" under 2 of 10 analysis seeds (1 of 10 at 48 draws), inconclusive under the
    rest; a 120-trial study of the same space calls the pair inconclusive under all 10. With the
    chains, no seed calls it coupled, and lora_rank x init_std is "no sign" under every one."""
    import pandas as pd

    trials = pd.read_csv(Path(__file__).parent / "data" / "demo_seed0_trials.csv")
    for seed in range(10):
        by_pair = {(c.param_a, c.param_b): c.verdict() for c in coupling_analysis(trials, DEMO_SPACE, seed=seed)}
        assert not by_pair[("lr", "init_std")].startswith("coupled"), (seed, by_pair)
        assert by_pair[("lora_rank", "init_std")].startswith("no sign"), (seed, by_pair)


def test_the_demos_coupled_pair_is_never_called_one_at_a_time_on_a_design_that_covers_it():
    """The README demo with the coupling design (`csweep run demo --seeds 2 --sampler coupling
    --seed 0`, its 32 fitted trials saved): lora_rank x lr is coupled in truth (a LoRA makes val_loss
    rise with lr from ~0.03, no LoRA does not: rank 0 reads 0.095 at lr 0.003 and at 0.1, rank 8
    0.082 and 1.08, benchmarks/demo_truth.py; a 120-trial study calls the pair coupled, 33%). The random design's 35 trials left that corner
    empty (no rank-0 or rank-2 config above lr 0.04) and called the pair "no sign"; on the coupling
    design's trials no analysis seed does and the interval reaches past 30% (its lower bound sits on
    the 5% line: coupled under 4 of 10 seeds, inconclusive under 6; benchmarks/RESULTS.md)."""
    import pandas as pd

    trials = pd.read_csv(Path(__file__).parent / "data" / "demo_coupling_seed0_trials.csv")
    for seed in range(10):
        pair = next(c for c in coupling_analysis(trials, DEMO_SPACE, seed=seed)
                    if {c.param_a, c.param_b} == {"lora_rank", "lr"})
        assert not pair.verdict_key == "no sign of coupling", (seed, pair.sentence())
        assert pair.ci_high > 0.3 and pair.strength > 0.1, (seed, pair.sentence())
