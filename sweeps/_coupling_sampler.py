"""`--sampler coupling`: a design aimed at the study's question, which pairs are coupled.

It starts space-filling (Optuna's scrambled Sobol QMCSampler) and then, trial by trial, picks
from a Sobol pool of candidates the config where the declared pairs' interactions (the space's
`hypotheses`; with none, every pair) are most uncertain: the summed posterior variance of their
interaction components under the fully Bayesian ANOVA GP that the report uses (reports._gp),
each pair's variance relative to its prior one. A pair's interaction is learnt where it moves
the loss most against what is known, typically towards the corners of the pair; the trials in
flight count as observed (a GP's posterior variance does not depend on their values), so that
parallel workers do not pick the same config.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from optuna.samplers import BaseSampler

N_CANDIDATES = 512
MAX_FIT_DESIGN = 60  # the trials a suggestion's surrogate conditions on (a random subset beyond)


class CouplingSampler(BaseSampler):
    """An Optuna sampler (optuna.samplers.BaseSampler's interface). `pairs`: the pairs to learn
    ([] for every pair); `n_startup`: trials drawn by scrambled Sobol first [2 x params + 2]."""

    def __init__(self, *, pairs: Sequence[tuple[str, str]] = (), n_startup: int | None = None,
                 seed: int | None = None) -> None:
        import optuna

        self.pairs = [tuple(p) for p in pairs]
        self.n_startup = n_startup
        self.seed = seed
        self._qmc = optuna.samplers.QMCSampler(qmc_type="sobol", scramble=True, seed=seed,
                                               warn_independent_sampling=False)
        self._rng = np.random.default_rng(seed)
        self._space: dict[str, Any] | None = None

    # --- Optuna's sampler interface ----------------------------------------------------
    def reseed_rng(self) -> None:
        self._qmc.reseed_rng()
        self._rng = np.random.default_rng()

    def infer_relative_search_space(self, study: Any, trial: Any) -> dict[str, Any]:
        from optuna.search_space import intersection_search_space

        space = {k: v for k, v in intersection_search_space(study.get_trials(deepcopy=False)).items()
                 if not v.single()}
        if self._started(study, space):
            self._space = space
            return space
        self._space = None
        return self._qmc.infer_relative_search_space(study, trial)

    def sample_relative(self, study: Any, trial: Any, search_space: dict[str, Any]) -> dict[str, Any]:
        if self._space is None or not search_space:
            return self._qmc.sample_relative(study, trial, search_space)
        return self._suggest(study, search_space)

    def sample_independent(self, study: Any, trial: Any, param_name: str, param_distribution: Any) -> Any:
        return self._qmc.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: Any, trial: Any) -> None:
        self._qmc.before_trial(study, trial)

    def after_trial(self, study: Any, trial: Any, state: Any, values: Sequence[float] | None) -> None:
        self._qmc.after_trial(study, trial, state, values)

    # --- the design ----------------------------------------------------------------------
    def _started(self, study: Any, space: dict[str, Any]) -> bool:
        from optuna.trial import TrialState

        if len(space) < 2:
            return False
        done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        return len(done) >= (self.n_startup if self.n_startup is not None else 2 * len(space) + 2)

    def _suggest(self, study: Any, space: dict[str, Any]) -> dict[str, Any]:
        import warnings

        from optuna.distributions import CategoricalDistribution
        from optuna.trial import TrialState
        from threadpoolctl import threadpool_limits

        from reports._gp import BayesGP

        names = list(space)
        cats = {n for n, d in space.items() if isinstance(d, CategoricalDistribution)}
        groups, width = [], 0
        for n in names:
            k = len(space[n].choices) if n in cats else 1
            groups.append(list(range(width, width + k)))
            width += k
        done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                if t.values and all(n in t.params for n in names) and math.isfinite(t.values[0])]
        pending = [t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                   if all(n in t.params for n in names)]
        x = np.array([self._encode(t.params, space, groups, width) for t in done])
        y = np.array([t.values[0] for t in done])
        with warnings.catch_warnings(), threadpool_limits(1):
            warnings.simplefilter("ignore")
            # a design needs where the interactions are unsure, not their exact shares: a lighter
            # surrogate than the report's (fewer draws, at most MAX_FIT_DESIGN trials)
            gp = BayesGP(x, y, groups, categorical=[n in cats for n in names], n_hyper=8, burn=80, thin=2,
                         seed=int(self._rng.integers(2**31)), max_fit=MAX_FIT_DESIGN)
            known = np.array([self._encode(t.params, space, groups, width) for t in pending]).reshape(-1, width)
            cand = self._candidates(space, names, groups, width)
            wanted = [p for p in gp.pairs if self._targeted(names[p[0]], names[p[1]])] or gp.pairs
            score = gp.interaction_variance(cand, wanted, extra=known)
        return self._decode(cand[int(np.argmax(score))], space, names, groups)

    def _targeted(self, a: str, b: str) -> bool:
        return not self.pairs or (a, b) in self.pairs or (b, a) in self.pairs

    @staticmethod
    def _encode(params: dict[str, Any], space: dict[str, Any], groups: list[list[int]], width: int) -> np.ndarray:
        from optuna.distributions import CategoricalDistribution

        row = np.zeros(width)
        for (name, dist), cols in zip(space.items(), groups):
            if isinstance(dist, CategoricalDistribution):
                row[cols[dist.choices.index(params[name])]] = 1.0
            else:
                v, lo, hi = float(params[name]), float(dist.low), float(dist.high)
                if dist.log:
                    v, lo, hi = math.log(v), math.log(lo), math.log(hi)
                row[cols[0]] = (v - lo) / (hi - lo) if hi > lo else 0.0
        return row

    def _candidates(self, space: dict[str, Any], names: list[str], groups: list[list[int]], width: int) -> np.ndarray:
        from optuna.distributions import CategoricalDistribution
        from scipy.stats import qmc

        u = qmc.Sobol(len(names), scramble=True, seed=int(self._rng.integers(2**31))).random(N_CANDIDATES)
        # the corners and edges of each pair are where an interaction shows most: half the pool is
        # pushed out to the range's ends
        push = self._rng.random(u.shape) < 0.5
        u = np.where(push, np.round(u), u)
        out = np.zeros((N_CANDIDATES, width))
        for i, (name, cols) in enumerate(zip(names, groups)):
            dist = space[name]
            if isinstance(dist, CategoricalDistribution):
                level = np.minimum((u[:, i] * len(cols)).astype(int), len(cols) - 1)
                out[np.arange(N_CANDIDATES), np.array(cols)[level]] = 1.0
            else:
                out[:, cols[0]] = self._snap(u[:, i], dist)
        return out

    @staticmethod
    def _snap(v: np.ndarray, dist: Any) -> np.ndarray:
        """Scaled values moved onto the values the distribution can take (int, step)."""
        lo, hi = float(dist.low), float(dist.high)
        step = getattr(dist, "step", None)
        if dist.log:
            if isinstance(dist.low, int) and not isinstance(dist.low, bool):
                real = np.round(np.exp(math.log(lo) + v * (math.log(hi) - math.log(lo))))
                return (np.log(np.clip(real, lo, hi)) - math.log(lo)) / (math.log(hi) - math.log(lo))
            return v
        if step:
            real = lo + np.round(v * (hi - lo) / step) * step
            return (np.clip(real, lo, hi) - lo) / (hi - lo)
        return v

    @staticmethod
    def _decode(row: np.ndarray, space: dict[str, Any], names: list[str], groups: list[list[int]]) -> dict[str, Any]:
        from optuna.distributions import CategoricalDistribution, IntDistribution

        out: dict[str, Any] = {}
        for name, cols in zip(names, groups):
            dist = space[name]
            if isinstance(dist, CategoricalDistribution):
                out[name] = dist.choices[int(np.argmax(row[cols]))]
                continue
            v, lo, hi = float(row[cols[0]]), float(dist.low), float(dist.high)
            real = math.exp(math.log(lo) + v * (math.log(hi) - math.log(lo))) if dist.log else lo + v * (hi - lo)
            if dist.step:
                real = lo + round((real - lo) / dist.step) * dist.step
            real = min(max(real, lo), hi)
            out[name] = int(round(real)) if isinstance(dist, IntDistribution) else float(real)
        return out
