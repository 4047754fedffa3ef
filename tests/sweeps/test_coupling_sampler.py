"""`--sampler coupling` in-process: the design decides a moderate coupling at 30 trials far more
often than random designs do, calls nothing else coupled, stays inside a memory budget and out
of a region where runs diverge; the seed plan (`--seed-plan design`) keeps both sides of the verdict right at 30 trials of 2 seeds."""

from __future__ import annotations

import warnings

import optuna
import pytest
from synthetic import UNIT_SPACE, designed_moderate_study

from reports import coupling_analysis
from common.attrs import MAX_MEM
from sweeps import CouplingSampler

optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


@pytest.mark.slow
def test_the_coupling_design_decides_a_moderate_coupling_at_30_trials():
    """The issue's objective (the pair's interaction 12% of the noise-free variance, spread 2.8x
    the noise): random designs call it coupled in about 1 of 10 studies at 30 trials; the
    coupling design in 80 of 100 on fresh seeds (benchmarks/RESULTS.md): here at least 7 of 10,
    never "no sign", and no other pair coupled in any."""
    called, wrong = 0, []
    for s in range(10):
        for c in coupling_analysis(designed_moderate_study(5000 + s, 30), UNIT_SPACE, seed=s):
            planted = {c.param_a, c.param_b} == {"warm", "sigma"}
            if planted:
                called += c.verdict_key == "coupled"
                assert not c.verdict_key == "no sign of coupling", (s, c)
            elif c.verdict_key == "coupled":
                wrong.append((s, c.param_a, c.param_b))
    assert called >= 7, called
    assert not wrong, wrong


@pytest.mark.slow
def test_on_an_objective_without_interactions_the_design_calls_no_pair_coupled():
    """The other side of the same verdict: the moderate planting without its interaction, on
    configs the coupling design picks (which seeks out the corners, where a spurious interaction
    would show): no pair called coupled in any of 10 studies at 30 trials (0 of 240 pairs on 40
    seeds measured), and most pairs settled as "no sign" (53 of 60 measured; 48 with the
    midpoint quadrature)."""
    coupled, no_sign, pairs = [], 0, 0
    for s in range(10):
        for c in coupling_analysis(designed_moderate_study(6000 + s, 30, coupled=False), UNIT_SPACE, seed=s):
            pairs += 1
            no_sign += c.verdict_key == "no sign of coupling"
            if c.verdict_key == "coupled":
                coupled.append((s, c.param_a, c.param_b))
    assert pairs == 60
    assert not coupled, coupled
    assert no_sign >= 40, no_sign


def _memory_study(budget: float | None, seed: int = 0) -> list[float]:
    """Two knobs; peak memory grows with x (100 MB at 0, 1,100 at 1); the loss interacts, so the
    design wants the corners, x = 1 among them."""
    study = optuna.create_study(directions=["minimize", "minimize"], sampler=CouplingSampler(seed=seed))
    study.set_metric_names(["val_loss", "peak_mem_mb"])
    if budget is not None:
        study.set_user_attr(MAX_MEM, budget)
    space = {"x": optuna.distributions.FloatDistribution(0.0, 1.0),
             "y": optuna.distributions.FloatDistribution(0.0, 1.0)}
    mems = []
    for _ in range(22):
        t = study.ask(space)
        x, y = t.params["x"], t.params["y"]
        mem = 100.0 + 1000.0 * x
        study.tell(t, [(x - 0.5) * (y - 0.5) + 0.1 * y, mem])
        mems.append(mem)
    return mems[6:]  # after the space-filling start (2 x params + 2 trials)


@pytest.mark.slow
def test_with_a_memory_budget_the_design_proposes_configs_that_fit_it():
    free, capped = _memory_study(None), _memory_study(600.0)
    assert max(free) > 600.0  # without a budget the design goes to the corners, x = 1 among them
    assert max(capped) <= 600.0, capped


@pytest.mark.slow
def test_the_seed_plan_decides_both_sides_at_30_trials_of_2_seeds():
    """`--seed-plan design` (`--trials 30 --seeds 2`: 60 runs, 2 seeds on the design's start, 1
    after): the moderate planting called coupled and never "no sign" (39 of 40 measured on seeds
    7000-7119), and the same objective without its interaction never called coupled (0 of 20
    measured); here the planted pair called coupled in at least 5 of 6 studies and no wrong
    verdict on either side."""
    called, wrong = 0, []
    for s in range(6):
        for coupled in (True, False):
            df = designed_moderate_study(7000 + s, 30, n_seeds=2, seed_plan="design", coupled=coupled)
            assert df["n_seeds"].sum() == 60 and df["n_seeds"].min() >= 1
            for c in coupling_analysis(df, UNIT_SPACE, seed=s):
                planted = coupled and {c.param_a, c.param_b} == {"warm", "sigma"}
                v = c.verdict()
                if planted:
                    called += v.startswith("coupled")
                    if v.startswith("no sign"):
                        wrong.append((s, coupled, c.param_a, c.param_b, v))
                elif v.startswith("coupled"):
                    wrong.append((s, coupled, c.param_a, c.param_b, v))
    assert called >= 5, called
    assert not wrong, wrong


@pytest.mark.slow
def test_the_design_stops_proposing_a_region_where_runs_diverge():
    """Runs with lr > 0.7 and sigma > 0.5 diverge (15% of the space; the demo's high-lr corner):
    they are pruned, as the divergence stop leaves them, with no value for the surrogate. The
    design before this test put 43% of its trials there (518 of 1,200 in 40 studies of 30 trials,
    benchmarks/diverging_region.py), where nothing is learnt; it now learns the region from the
    pruned trials and proposes it less than its share of the space (149 of 1,200; here 66 of 150
    before), and the verdicts stay right: the planted pair never "no sign", no other pair
    coupled."""
    corner = lambda p: p["lr"] > 0.7 and p["sigma"] > 0.5  # noqa: E731
    inside, wrong = 0, []
    for s in range(5):
        study = designed_moderate_study(9000 + s, 30, diverges=corner)
        inside += study.attrs["pruned"]
        for c in coupling_analysis(study, UNIT_SPACE, seed=s):
            verdict, planted = c.verdict(), {c.param_a, c.param_b} == {"warm", "sigma"}
            if (planted and verdict.startswith("no sign")) or (not planted and verdict.startswith("coupled")):
                wrong.append((s, c.param_a, c.param_b, verdict))
    assert inside <= 0.15 * 5 * 30, inside
    assert not wrong, wrong
