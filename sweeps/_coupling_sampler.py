"""`--sampler coupling`: a design aimed at the study's question, which pairs are coupled.

It starts space-filling (Optuna's scrambled Sobol QMCSampler) and then, trial by trial, picks
from a Sobol pool of candidates the config that would most shrink what is unknown of the
declared pairs' interactions (the space's `hypotheses`; with none, every pair): the posterior
variance of their interaction components, integrated over each pair's grid, that observing the
config would remove, under the fully Bayesian ANOVA GP that the report uses (common.gp; an
integrated-variance design). Measured on the moderate planting at 30 trials, in-process, fresh
seeds 9100-9159: the planted pair called coupled in 48 of 60 studies, against 37 of 60 with the
design before (the largest posterior variance at the candidate, the main effects' at half
weight beside it); benchmarks/RESULTS.md has the rest. A pair's interaction is learnt where it
moves the loss most against what is known, typically towards the corners of the pair; the
trials in flight count as observed (a GP's posterior variance does not depend on their values),
so that parallel workers do not pick the same config. With `--seeds K` the surrogate takes each
trial's replicate standard error as its known noise, and with `--seed-plan design` it spends the
seeds (`seeds_for`): K on each config of its space-filling start, one on each after; with
`--max-mem-mb` only candidates whose peak memory, predicted from the trials so far, fits the
budget are proposed. Trials that failed or diverged count as seen (another run there is not
proposed for its variance) and mark a region: candidates where a fit of the failures predicts a
failure are not proposed (benchmarks/RESULTS.md: a diverging corner of 15% of the space drew 43%
of the design's trials before, 12% after). A run that completed without converging (health
diverged or degrading) is such a trial too, and where training breaks is a question of its own:
the report's stability model (reports._stability) keeps the candidates predicted to converge and
never a config that broke, and every BOUNDARY_EVERY-th trial goes to the boundary itself
(`_boundary`; docs/calibration.md, "Where training breaks": 21% of a 40-trial study's runs past a
boundary that half the space lies beyond, against 54% of a random design's).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from optuna.samplers import BaseSampler

N_CANDIDATES = 512
PUSH = 0.7  # the share of a candidate's coordinates pushed to its range's ends (benchmarks/RESULTS.md)
USABLE_C = 10.0  # the inverse L2 penalty of the fit of where runs fail (1, 10, 100 measured: RESULTS.md)
MAX_FIT_DESIGN = 60  # the trials a suggestion's surrogate conditions on (a random subset beyond)
SAFE_BELOW = 0.3  # candidates predicted to break with at least this probability are not proposed
BOUNDARY_EVERY = 2  # once runs have broken, every this-many-th trial is spent on the boundary
# the boundary posterior's chain (common.boundary): from the penalised fit, or from where the
# previous trial's chain ended (benchmarks/RESULTS.md: the same verdicts, a third of the time)
COLD_CHAIN = {"steps": 500, "burn": 300, "thin": 4}
WARM_CHAIN = {"steps": 150, "burn": 50, "thin": 2}
WARM_BURN = 20  # the surrogate's burn-in from where the previous trial's hyperparameter chain ended


def _not_converged(t: Any) -> bool:
    """A COMPLETE run whose objective labelled it diverged or degrading (a plug-in's tags, the
    built-in health monitor): its value says where training breaks, not how the knobs trade off."""
    from common.runs import UNSETTLED, health_of

    return health_of(t) in UNSETTLED


def _sems(trials: Sequence[Any]) -> np.ndarray | None:
    """The trials' replicate standard errors of val_loss (--seeds K); a trial without one (a
    single seed) gets the median one seed's noise (a replicated trial's sem x sqrt(its seeds))
    over sqrt(its own seeds); None when no trial has one."""
    from common.attrs import N_SEEDS, VAL_LOSS_SEM

    sem = np.array([float(t.user_attrs.get(VAL_LOSS_SEM) or math.nan) for t in trials])
    seeds = np.array([max(1, int(t.user_attrs.get(N_SEEDS) or 1)) for t in trials], dtype=float)
    good = np.isfinite(sem)
    if not good.any():
        return None
    one_seed = float(np.median(sem[good] * np.sqrt(seeds[good])))
    return np.where(good, sem, one_seed / np.sqrt(seeds))


def default_startup(n_params: int) -> int:
    """The space-filling trials the design starts with: 2 x params + 2."""
    return 2 * n_params + 2


class CouplingSampler(BaseSampler):
    """An Optuna sampler (optuna.samplers.BaseSampler's interface). `pairs`: the pairs to learn
    ([] for every pair); `n_startup`: trials drawn by scrambled Sobol first [2 x params + 2];
    `qmc_seed`: that sequence's scramble seed [seed]. `warm_start`: each trial's chains start
    where the previous trial's ended (benchmarks/design_chains.py compares the cold starts)."""

    def __init__(self, *, pairs: Sequence[tuple[str, str]] = (), n_startup: int | None = None,
                 seed: int | None = None, qmc_seed: int | None = None, warm_start: bool = True) -> None:
        import optuna

        self.pairs = [tuple(p) for p in pairs]
        self.n_startup = n_startup
        self.seed = seed
        self._qmc = optuna.samplers.QMCSampler(qmc_type="sobol", scramble=True,
                                               seed=seed if qmc_seed is None else qmc_seed,
                                               warn_independent_sampling=False)
        self._rng = np.random.default_rng(seed)
        self._space: dict[str, Any] | None = None
        self._walkers: np.ndarray | None = None  # where the boundary posterior's chain ended
        self._hyper_start: np.ndarray | None = None  # where the surrogate's hyperparameter chain ended
        self.warm_start = warm_start

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

    # --- seeds (--seed-plan design) ----------------------------------------------------
    def startup_trials(self, n_params: int) -> int:
        return self.n_startup if self.n_startup is not None else default_startup(n_params)

    def seeds_for(self, trial: Any, seeds: int) -> int:
        """How many of `seeds` training runs the design spends on `trial` (--seed-plan design):
        all of them on the space-filling start, whose replicates measure the seed noise that
        every verdict's interval rests on, and one on every trial after it. Per training run,
        the integrated variance a config removes, sum cov(f_c(g), y(p))^2 / (k var f(p) + noise)
        for k seeds there, falls with k, and a new config at the best candidate removes at
        least as much as another seed at an old one: past the noise floor a replicate buys less
        of the verdict than a config does (benchmarks/seed_budget.py measures it)."""
        space = [d for d in trial.distributions.values() if not d.single()]
        return seeds if trial.number < self.startup_trials(len(space)) else 1

    # --- the design ----------------------------------------------------------------------
    def _started(self, study: Any, space: dict[str, Any]) -> bool:
        from optuna.trial import TrialState

        if len(space) < 2:
            return False
        done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        return len(done) >= self.startup_trials(len(space))

    def _suggest(self, study: Any, space: dict[str, Any]) -> dict[str, Any]:
        import warnings

        from optuna.distributions import CategoricalDistribution
        from optuna.trial import TrialState
        from threadpoolctl import threadpool_limits

        from common.gp import BayesGP

        names = list(space)
        cats = {n for n, d in space.items() if isinstance(d, CategoricalDistribution)}
        groups, width = [], 0
        for n in names:
            k = len(space[n].choices) if n in cats else 1
            groups.append(list(range(width, width + k)))
            width += k
        metrics = list(study.metric_names or ["val_loss", "peak_mem_mb"])
        iv = metrics.index("val_loss") if "val_loss" in metrics else 0
        complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        broken = {t.number for t in complete if _not_converged(t)}
        done = [t for t in complete if t.values and all(n in t.params for n in names) and math.isfinite(t.values[iv])
                and t.number not in broken]
        # configs seen without a value the surrogate can use count as observed: trials in flight
        # (a GP's posterior variance does not depend on their values) and trials that failed or
        # were stopped (diverged, beaten at a rung, out of memory), where another run would teach
        # the design nothing it can use; left out, a region that diverges keeps its variance and
        # is proposed again and again (benchmarks/RESULTS.md, "When a region of the space
        # diverges"); the last MAX_FIT_DESIGN of them, so that many stopped trials cost no more
        unusable = sorted([t for t in study.get_trials(deepcopy=False, states=(TrialState.PRUNED, TrialState.FAIL))]
                          + [t for t in complete if t.values and (not math.isfinite(t.values[iv]) or t.number in broken)],
                          key=lambda t: t.number)
        unusable = [t for t in unusable if all(n in t.params for n in names)]
        pending = [t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                   if all(n in t.params for n in names)] + unusable[-MAX_FIT_DESIGN:]
        x = np.array([self._encode(t.params, space, groups, width) for t in done])
        y = np.array([t.values[iv] for t in done])
        with warnings.catch_warnings(), threadpool_limits(1):
            warnings.simplefilter("ignore")
            # a design needs where the interactions are unsure, not their exact shares: a lighter
            # surrogate than the report's (one chain, fewer draws, at most MAX_FIT_DESIGN trials);
            # with --seeds K the replicates' standard errors are the trials' known noise
            # the chain starts where the previous trial's fit ended (on at most a few trials less)
            warm = self._hyper_start is not None
            gp = BayesGP(x, y, groups, categorical=[n in cats for n in names], n_hyper=8,
                         burn=WARM_BURN if warm else 80, thin=2, chains=1, seed=int(self._rng.integers(2**31)),
                         max_fit=MAX_FIT_DESIGN, sem=_sems(done), start=self._hyper_start)
            self._hyper_start = np.array(gp.last) if len(gp.last) and self.warm_start else None
            known = np.array([self._encode(t.params, space, groups, width) for t in pending]).reshape(-1, width)
            cand = self._candidates(space, names, groups, width)
            cand = self._within_budget(study, cand, space, groups, width, metrics)
            cand = self._where_usable(study, cand, x, unusable, space, groups, width)
            cand, boundary = self._boundary(study, cand, space, groups, width, known)
            if boundary is not None:
                return self._decode(cand[int(np.argmax(boundary))], space, names, groups)
            wanted = [p for p in gp.pairs if self._targeted(names[p[0]], names[p[1]])] or gp.pairs
            score = gp.variance_reduction(cand, wanted, extra=known)
        return self._decode(cand[int(np.argmax(score))], space, names, groups)

    def _boundary(self, study: Any, cand: np.ndarray, space: dict[str, Any], groups: list[list[int]], width: int,
                  known: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Where runs stop converging (health diverged or degrading, or stopped as diverging), as
        the report's stability analysis models it (reports._stability: a Bayesian logistic
        regression of P(not converged) on the knobs), once at least two runs of each kind exist:
        the candidates kept are those predicted to converge with probability over 1 - SAFE_BELOW
        (the least risky quarter when none is), never a config that already broke; and every
        BOUNDARY_EVERY-th trial after the start is spent on the boundary itself: the kept candidate
        whose outcome would teach the model most (the mutual information of the outcome and the
        weights, BALD), away from the trials in flight. Returns (candidates, their boundary score
        when this trial is the boundary's, else None)."""
        from common.boundary import kept_columns, posterior_chain
        from common.runs import run_labels

        from common.attrs import HEALTH, REPLICATE_HEALTH, RUNG, is_replaced

        rows, labels = [], []
        for t in study.get_trials(deepcopy=False):
            if not all(n in t.params for n in space) or is_replaced(study, t) or t.state.name == "RUNNING":
                continue
            runs = run_labels(t.state.name, str(t.user_attrs.get(HEALTH, "")),
                              outcome="ok" if t.values else "", at_rung=t.user_attrs.get(RUNG) is not None,
                              replicates=t.user_attrs.get(REPLICATE_HEALTH) or ())
            rows += [self._encode(t.params, space, groups, width)] * len(runs)
            labels += runs
        y = np.array(labels, dtype=float)
        if y.sum() < 2 or len(y) - y.sum() < 2:
            return cand, None
        named = dict(zip(space, groups))
        keep_cols = kept_columns(named, [n for n, cols in named.items() if len(cols) > 1])  # as the report's
        x = np.array(rows)
        # the walkers start where the previous trial's chain ended (its runs less at most a few):
        # already in the posterior, a short burn-in suffices
        warm = self._walkers is not None and self._walkers.shape[1] == 1 + len(keep_cols)
        w, walkers = posterior_chain(x[:, keep_cols], y, seed=int(self._rng.integers(2**31)),
                                           start=self._walkers if warm else None, **(WARM_CHAIN if warm else COLD_CHAIN))
        self._walkers = walkers if self.warm_start else None
        w = w[self._rng.choice(len(w), min(len(w), 256), replace=False)]
        p = 1 / (1 + np.exp(-(w[:, :1] + w[:, 1:] @ cand[:, keep_cols].T)))  # draws x candidates
        mean = p.mean(axis=0)
        broke = x[y == 1]
        fresh = ~(np.abs(cand[:, None, :] - broke[None, :, :]).max(axis=2) < 1e-9).any(axis=1)
        safe = (mean < SAFE_BELOW) & fresh
        if not safe.any():
            safe = fresh & (mean <= np.quantile(mean[fresh], 0.25)) if fresh.any() else mean <= np.quantile(mean, 0.25)
        cand, p, mean = cand[safe], p[:, safe], mean[safe]
        done = sum(1 for t in study.get_trials(deepcopy=False) if t.state.name != "RUNNING")
        if done % BOUNDARY_EVERY:
            return cand, None
        h = lambda q: -(q * np.log(q + 1e-12) + (1 - q) * np.log(1 - q + 1e-12))  # noqa: E731
        score = h(mean) - h(p).mean(axis=0)
        if len(known):
            near = (np.abs(cand[:, None, :] - known[None, :, :]).max(axis=2) < 0.1).any(axis=1)
            score = np.where(near, -np.inf, score) if (~near).any() else score
        return cand, score

    def _within_budget(self, study: Any, cand: np.ndarray, space: dict[str, Any], groups: list[list[int]],
                       width: int, metrics: list[str]) -> np.ndarray:
        """With a memory budget (--max-mem-mb), the candidates whose predicted peak memory fits it
        (all of them when none is predicted to). The prediction: a ridge fit of log peak memory on
        the design (and its squares, given enough trials) over the trials that measured it
        (finished ones, and the peak a stopped one reached), plus its largest leave-one-out
        residual, so that a config near one that did not fit is not proposed."""
        from optuna.trial import TrialState

        from common.attrs import MAX_MEM, PEAK_MEM_SEEN

        budget = study.user_attrs.get(MAX_MEM)
        if budget is None or "peak_mem_mb" not in metrics:
            return cand
        im = metrics.index("peak_mem_mb")
        rows, mem = [], []
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
            m = t.values[im] if t.values else t.user_attrs.get(PEAK_MEM_SEEN)
            if m is not None and math.isfinite(float(m)) and float(m) > 0 and all(n in t.params for n in space):
                rows.append(self._encode(t.params, space, groups, width))
                mem.append(math.log(float(m)))
        if len(rows) < 3:
            return cand
        rows = np.array(rows)
        # the squares once there are twice as many trials as terms to fit (on 6 trials of two knobs
        # the quadratic fit let a 771 MB config through a 600 MB budget)
        square = len(rows) >= 2 * (1 + 2 * rows.shape[1])
        feats = lambda a: np.hstack([np.ones((len(a), 1)), a] + ([a * a] if square else []))  # noqa: E731
        f, target = feats(rows), np.array(mem)
        inv = np.linalg.inv(f.T @ f + 1e-3 * np.eye(f.shape[1]))
        coef = inv @ f.T @ target
        # leave-one-out residuals (the ridge fit's r / (1 - h)): how far it misses a config it did
        # not see, which the candidates are; the in-sample residuals understate it (a 662 MB
        # config passed a 600 MB budget)
        lev = np.einsum("ij,jk,ik->i", f, inv, f)
        slack = float(np.max(np.abs(target - f @ coef) / np.maximum(1.0 - lev, 1e-3)))
        fits = feats(cand) @ coef + slack <= math.log(float(budget))
        return cand[fits] if fits.any() else cand

    def _where_usable(self, study: Any, cand: np.ndarray, x: np.ndarray, unusable: list[Any],
                      space: dict[str, Any], groups: list[list[int]], width: int) -> np.ndarray:
        """The candidates where a run most likely gives a usable value (all of them when none is
        predicted to): a logistic regression on the design, its squares and its pairs' products
        (scikit-learn's, L2-penalised) of which trials failed or diverged (`unusable`), so that the
        design stops proposing a region where runs fail, which would buy the verdicts nothing.
        Trials stopped at a rung because others beat them (--early-stop dominated) ran fine, and a
        trial whose config was run again (interrupted, stale) did not fail for its config: neither
        counts as failed."""
        from sklearn.linear_model import LogisticRegression
        from sklearn.preprocessing import PolynomialFeatures

        from common.attrs import RUNG, is_replaced

        bad = [self._encode(t.params, space, groups, width) for t in unusable
               if t.user_attrs.get(RUNG) is None and not is_replaced(study, t)]
        if not bad or not len(x):
            return cand
        feats = PolynomialFeatures(2, include_bias=False)
        rows = feats.fit_transform(np.vstack([x, np.array(bad)]))
        fit = LogisticRegression(C=USABLE_C, max_iter=1000).fit(rows, np.r_[np.zeros(len(x)), np.ones(len(bad))])
        keep = fit.predict_proba(feats.transform(cand))[:, 1] < 0.5
        return cand[keep] if keep.any() else cand

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
        # the corners and edges of each pair are where an interaction shows most: each coordinate
        # is pushed out to its range's ends with probability PUSH (0.7 decided the moderate planting
        # at 30 trials in 32 of 40 in-process studies, 0.5 in 14 of 20 and 0.85 in 15 of 20)
        push = self._rng.random(u.shape) < PUSH
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
