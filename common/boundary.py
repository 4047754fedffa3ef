"""Where training breaks, as a Bayesian logistic regression of P(a run does not converge) on the
knobs scaled to their ranges: Cauchy(0, 5) slopes (Gelman et al. 2008), a Cauchy(0, 10)
intercept, sampled by emcee. The report's stability analysis (reports._stability) and the
coupling design's boundary (sweeps._coupling_sampler) draw from this one posterior."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

PRIOR_SCALE = 5.0  # Cauchy scale of a slope per unit range (2.5 per 0.5 sd, Gelman et al. 2008)
INTERCEPT_SCALE = 10.0


def kept_columns(groups: Mapping[str, Sequence[int]], categorical: Iterable[str]) -> list[int]:
    """The design's columns the logistic model takes: every numeric knob's, and each categorical
    knob's one-hot columns but its first level's (the intercept carries that level). The report's
    analysis and the coupling design's boundary drop the same columns through this."""
    cats = set(categorical)
    return [c for name, cols in groups.items() for c in (list(cols)[1:] if name in cats else cols)]


def _log_posterior(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Vectorised over rows of w (walkers x (1 + features)): Bernoulli-logit likelihood, Cauchy priors."""
    eta = w[:, :1] + w[:, 1:] @ x.T
    ll = (y * eta - np.logaddexp(0.0, eta)).sum(axis=1)
    prior = -np.log1p((w[:, 0] / INTERCEPT_SCALE) ** 2) - np.log1p((w[:, 1:] / PRIOR_SCALE) ** 2).sum(axis=1)
    return ll + prior


def posterior_draws(x: np.ndarray, y: np.ndarray, *, seed: int = 0, walkers: int | None = None,
                    steps: int = 1500, burn: int = 700, thin: int = 8) -> np.ndarray:
    """Draws (n x (1 + features)) of the logistic model's weights, intercept first."""
    return posterior_chain(x, y, seed=seed, walkers=walkers, steps=steps, burn=burn, thin=thin)[0]


def posterior_chain(x: np.ndarray, y: np.ndarray, *, seed: int = 0, walkers: int | None = None,
                    steps: int = 1500, burn: int = 700, thin: int = 8,
                    start: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(draws, the walkers' last positions). The walkers start near the penalised fit (scikit-
    learn's L2 logistic regression), spread by its scale, or at `start` (walkers x (1 +
    features)): the last positions of a chain on nearly the same runs (the design's previous
    trial), already in the posterior, so that a short burn-in suffices."""
    import emcee

    dim = 1 + x.shape[1]
    rng = np.random.default_rng(seed)
    if start is not None and start.ndim == 2 and start.shape[1] == dim:
        walkers = len(start)
        begin = start + rng.normal(0, 1e-3, start.shape)  # no two walkers on one point
    else:
        walkers = walkers or max(32, 4 * dim)
        from sklearn.linear_model import LogisticRegression

        if 0 < y.sum() < len(y):
            fit = LogisticRegression(C=1.0, max_iter=2000).fit(x, y)
            centre = np.r_[fit.intercept_, fit.coef_.ravel()]
        else:
            centre = np.r_[4.0 * (1 if y.mean() > 0.5 else -1), np.zeros(x.shape[1])]
        begin = centre + rng.normal(0, 0.5, (walkers, dim))
    sampler = emcee.EnsembleSampler(walkers, dim, _log_posterior, args=(x, y), vectorize=True)
    sampler.random_state = np.random.RandomState(seed).get_state()  # emcee's public seeding: repeatable draws
    sampler.run_mcmc(begin, steps, progress=False)
    return sampler.get_chain(discard=burn, thin=thin, flat=True), sampler.get_last_sample().coords
