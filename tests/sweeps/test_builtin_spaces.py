"""Every built-in search space trains: both ends of every range (and every choice) of each space,
through the objective as a worker runs it, a few steps each. `csweep run` itself is driven end
to end in test_sweep_e2e.py."""

from __future__ import annotations

import pytest

from search_spaces import builtin_space_names, load_space
from sweeps._result import Kind
from sweeps._workers import run_trial

pytestmark = pytest.mark.slow  # trains the tiny model a few times per space


def corner_configs(space) -> list[dict]:
    """Two configs: every param at its low end (first choice), then at its high end (last)."""
    lows = {p.name: p.extremes()[0] for p in space.params}
    highs = {p.name: p.extremes()[-1] for p in space.params}
    return [lows, highs]


@pytest.mark.parametrize("name", builtin_space_names())
def test_builtin_space_trains_at_both_ends_of_its_ranges(name):
    space = load_space(name)
    results = []
    for params in corner_configs(space):
        config = {**space.fixed, **params, "steps": 3}
        results.append(run_trial("objectives._textual_inversion:textual_inversion", True, config,
                                 model="tiny", data=None))
    # a config may be stopped by the health checks (pruned, with its reason); none may fail
    assert all(r.kind in (Kind.OK, Kind.PRUNED) for r in results), [r.reason for r in results]
    assert any(r.kind is Kind.OK for r in results)
    for r in results:
        if r.kind is Kind.OK:
            assert r.metrics["val_loss"] > 0 and r.metrics["peak_mem_mb"] > 0
            assert r.config["steps"] == 3 and "precision" in r.config  # the resolved config


@pytest.mark.parametrize("model,family", [("random:sd15", "sd15"), ("random:sdxl", "sdxl")])
def test_every_builtin_space_has_ranges_for_the_real_model_families(model, family, tmp_path):
    """A real model takes the space's profile for its family (from --model, or --profile): the
    trainers' step counts and lr ranges instead of the tiny model's, every value checked against
    the real shapes (embedding_dim <= 768, unfreeze_layers <= the used encoder layers)."""
    from search_spaces import builtin_space_names, load_space
    from sweeps.commands import build_parser
    from sweeps.commands.run import run_config

    for name in builtin_space_names():
        tiny = load_space(name)
        assert set(tiny.profiles) == {"sd15", "sdxl"}, name
        cfg = run_config(build_parser().parse_args(["run", name, "--model", model, "--workdir", str(tmp_path)]))
        assert cfg.profile == family and cfg.space.profile == family
        assert cfg.fixed["steps"] >= 500 > tiny.fixed["steps"], name
    # --profile picks the family whatever the model (here the tiny one, for a space without shape rules)
    forced = run_config(build_parser().parse_args(["run", "warmup_init", "--profile", family, "--workdir", str(tmp_path)]))
    assert forced.space.to_dict() == load_space("warmup_init").for_profile(family).to_dict()
    assert forced.profile == family
    # the tiny model keeps the ranges the space's params give
    cfg = run_config(build_parser().parse_args(["run", "warmup_init", "--workdir", str(tmp_path)]))
    assert cfg.profile == "" and cfg.fixed["steps"] == 80
