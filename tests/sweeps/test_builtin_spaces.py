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
