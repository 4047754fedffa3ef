"""Samplers as records: each name builds its Optuna sampler, and what a sampler supports is
checked in one place, with one line naming the flag and the rule."""

from __future__ import annotations

import optuna
import pytest

from sweeps._samplers import SAMPLER_SPECS, SAMPLERS, check_sampler, make_sampler, sampler_spec


@pytest.mark.parametrize("name", SAMPLERS)
def test_every_sampler_builds_and_draws(name):
    sampler = make_sampler(name, seed=3, workers=2, pairs=[("a", "b")], qmc_seed=5)
    assert isinstance(sampler, optuna.samplers.BaseSampler)
    study = optuna.create_study(directions=["minimize", "minimize"], sampler=sampler)
    for _ in range(3):
        t = study.ask({"a": optuna.distributions.FloatDistribution(0, 1),
                       "b": optuna.distributions.FloatDistribution(1e-3, 1, log=True)})
        study.tell(t, [t.params["a"], t.params["b"]])
    assert len(study.trials) == 3


def test_what_each_sampler_supports_is_what_optuna_gives_it():
    assert SAMPLERS == ("tpe", "nsga2", "gp", "random", "qmc", "coupling")  # --sampler's choices, in order
    assert {n for n, s in SAMPLER_SPECS.items() if s.sobol} == {"qmc", "coupling"}
    assert {n for n, s in SAMPLER_SPECS.items() if s.hypotheses} == {"coupling"}
    # the samplers that read trial.set_constraint are those whose Optuna class takes constraints
    import inspect

    for name, spec in SAMPLER_SPECS.items():
        cls = type(make_sampler(name, seed=0, workers=1))
        takes = "constraints_func" in inspect.signature(cls).parameters
        assert spec.constraints == takes, name
    assert make_sampler("tpe", seed=0, workers=2)._constant_liar
    assert not make_sampler("tpe", seed=0, workers=1)._constant_liar


def test_a_run_that_a_sampler_cannot_serve_is_refused_in_one_line():
    assert check_sampler("coupling", source="s.yaml", params=1, seed_plan="every", seeds=1) == (
        "--sampler coupling: s.yaml samples 1 param; a coupling design needs two or more")
    assert "use it with --sampler coupling, not tpe" in check_sampler(
        "tpe", source="s.yaml", params=3, seed_plan="design", seeds=2)
    assert "K >= 2, got 1" in check_sampler("coupling", source="s.yaml", params=3, seed_plan="design", seeds=1)
    for name in SAMPLERS:  # good input is never refused
        assert check_sampler(name, source="s.yaml", params=2, seed_plan="every", seeds=1) is None
    with pytest.raises(ValueError, match="valid: tpe"):
        sampler_spec("bayes")
