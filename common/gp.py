"""A fully Bayesian Gaussian-process surrogate for the coupling and law analyses.

At 10-40 trials most of what a study does not know about its response surface is the
surrogate's own hyperparameters (which knobs matter, how smooth the surface is, how much is
noise, whether two knobs interact). A single fitted GP, or a bootstrap that keeps the first fit's
length scales, hides that and gives intervals far too narrow; a product kernel's prior also
leans towards additive fits at small N, and that lean was read as "no sign of coupling". Here:

1. the kernel is a second-order *orthogonal* additive one (functional ANOVA; Duvenaud et al.
   2011, Lu et al. 2022): k = c + sum_i s_i^2 k~_i + sum_{i<j} s_ij^2 k~_i k~_j, where each k~_i
   is a Matern 5/2 on knob i alone, centred to integrate to zero over the knob's range (uniform,
   by Gauss-Legendre quadrature; a categorical knob's levels equally weighted). Its components
   are then the ANOVA terms themselves: the variance of the (i, j) component over the space *is* the
   pair's pure interaction, and each pair has an interaction variance s_ij^2 of its own, under
   a wide prior centred on the coupled line, so the trials, not the kernel's form, say whether
   a pair interacts;
2. the hyperparameters are drawn from their posterior under log-normal priors, by elliptical
   slice sampling of the exact marginal likelihood (Murray, Adams & MacKay 2010), as fully
   Bayesian GPs in BoTorch/Ax draw theirs with NUTS, in several chains from dispersed starts
   (`CHAINS`): at 20-40 trials the posterior can have two modes (a knob's steep main effect, or
   an interaction with a knob whose values happen to follow it in the trials), and one chain
   stays in whichever it finds first, so that the verdict depended on the analysis' seed;
3. for each hyperparameter draw, every component is drawn jointly on its grid by pathwise
   conditioning (Wilson et al. 2020: exact prior draws at the grid and the trials, updated with
   the exact kernel), so that each draw gives every pair's share of the variance, every knob's
   best value and every law's exponent: their posteriors are the spread over draws, as in Ax's
   SobolSensitivityGPSampling.

Numpy only. A study of any size conditions on at most `MAX_FIT` trials (a seeded random subset
beyond), so that a report's cost stops growing with the study.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.linalg.lapack import dpotrf, dtrtrs

from ._kernels import SQRT5, _centre, _grid_moments, _grid_rows, _m52, _m52t, _mvn, _sqdist

MAX_FIT = 120  # trials the surrogate conditions on (a seeded random subset beyond)
# the analyses' hyperparameter chains and each one's burn-in: chains from dispersed starts see the
# modes that one chain would not leave (burn 50 left the curve rows' offset unconverged)
CHAINS, BURN = 6, 100
# quadrature nodes per numeric knob: the measure the variance is taken over. Gauss-Legendre nodes
# with their weights, not equally weighted midpoints: on Ishigami's S13 the true function's share
# is 0.2437 to four digits on 12 nodes, and 0.227 on 12 midpoints (benchmarks/quadrature.py)
QUAD = 12
JITTER = 1e-6
BATCH_CELLS = 2 * 48 * 48  # kernel cells the chains' likelihoods are evaluated together in (cache-sized)
# priors, in log space, for inputs scaled to [0, 1] and standardised y
LOG_LS_PRIOR = (math.log(1.0), 1.0)  # a knob's length scale: median 1, 95% within [0.14, 7.1]
LOG_MAIN = (None, 1.5)  # a knob's main-effect variance: median 1/knobs
LOG_PAIR = (math.log(0.05), 2.0)  # a pair's interaction variance: median at the coupled line, wide
LOG_NOISE = (math.log(0.05), 1.5)
LOG_CONST = (0.0, 1.0)


def quadrature(levels: int | None) -> tuple[np.ndarray, np.ndarray]:
    """A knob's grid in its design columns and the grid's weights (summing to one): a numeric
    knob's (levels None) QUAD Gauss-Legendre nodes on [0, 1], a categorical knob's levels one-hot,
    equally weighted."""
    if levels:
        return np.eye(levels), np.full(levels, 1.0 / levels)
    x, w = np.polynomial.legendre.leggauss(QUAD)
    return ((x + 1.0) / 2.0)[:, None], w / 2.0


@dataclass(frozen=True)
class Hyper:
    ls: np.ndarray  # per knob
    main: np.ndarray  # main-effect variance per knob
    pair: np.ndarray  # interaction variance per pair of knobs (BayesGP.pairs)
    noise: float  # extra noise variance beyond the measured seed noise (standardised units)
    const: float
    cluster: float = 0.0  # variance of an offset shared by the rows of one trial (its curve's points)


class BayesGP:
    """Posterior over the ANOVA components of val_loss given trials `x` (n, k) in the unit design
    space and values `y`. `groups`: the design columns of each knob; `categorical`: which knobs
    are one-hot (their grid is their levels). `sem`: each trial's measured standard error.
    `cluster`: per row, the trial it comes from, when rows are the points of trials' validation
    curves: the rows of one trial share its seed noise, so their noise is correlated, modelled as
    an offset per trial (a random intercept, its variance a hyperparameter drawn like the rest)
    beside the independent noise of each point."""

    def __init__(self, x: np.ndarray, y: np.ndarray, groups: list[list[int]], *, categorical: list[bool],
                 sem: np.ndarray | None = None, n_hyper: int = 24, seed: int = 0, burn: int = BURN,
                 thin: int = 3, max_fit: int = MAX_FIT, cluster: np.ndarray | None = None,
                 chains: int = CHAINS, start: np.ndarray | None = None) -> None:
        rng = np.random.default_rng(seed)
        if len(x) > max_fit:
            keep = rng.choice(len(x), max_fit, replace=False)
            x, y = x[keep], y[keep]
            sem = None if sem is None else sem[keep]
            cluster = None if cluster is None else np.asarray(cluster)[keep]
        self.cluster = None if cluster is None else np.unique(np.asarray(cluster), return_inverse=True)[1]
        self._same = None if self.cluster is None else (self.cluster[:, None] == self.cluster[None, :]).astype(float)
        self.x = np.asarray(x, dtype=float)
        self.mu, self.sd = float(np.mean(y)), float(np.std(y)) or 1.0
        self.y = (np.asarray(y, dtype=float) - self.mu) / self.sd
        self.known = np.zeros(len(y)) if sem is None else (np.asarray(sem, dtype=float) / self.sd) ** 2
        self.groups = [list(g) for g in groups]
        self.pairs = [(i, j) for i in range(len(groups)) for j in range(i + 1, len(groups))]
        # each knob's grid, in its own design columns
        self.grid, self.weights = map(list, zip(*(quadrature(len(g) if cat else None)
                                                 for g, cat in zip(self.groups, categorical))))
        self.rng = rng
        xs = [self.x[:, g] for g in self.groups]
        self._dxx = [_sqdist(v, v) for v in xs]
        self._dxq = [_sqdist(v, q) for v, q in zip(xs, self.grid)]
        self._dqq = [_sqdist(q, q) for q in self.grid]
        # knobs on the same grid (every numeric knob; categorical ones of as many levels), stacked,
        # so that the likelihood's kernels are a few array operations, not a few per knob
        same: dict[bytes, list[int]] = {}
        for g, q in enumerate(self.grid):
            same.setdefault(q.tobytes() + bytes(str(q.shape), "ascii"), []).append(g)
        # in the form the kernels read them: the distances' square roots, times sqrt(5), taken once
        self._roots = [(np.array(gs), [SQRT5 * np.sqrt(self._dxx[g]) for g in gs],
                        SQRT5 * np.sqrt(np.stack([self._dxq[g] for g in gs])), SQRT5 * np.sqrt(self._dqq[gs[0]]),
                        self.weights[gs[0]])
                       for gs in same.values()]
        # the likelihood reads a kernel's lower triangle alone (LAPACK's Cholesky with uplo L):
        # its cells i >= j, computed as a flat vector, are half the work of the whole matrix
        n = len(self.x)
        self._low = np.tril_indices(n)
        self._low_diag = np.flatnonzero(self._low[0] == self._low[1])
        self._low_roots = [(gs, np.stack([r[self._low] for r in rxx]), rxq, rqq, w) for gs, rxx, rxq, rqq, w in self._roots]
        self._low_same = None if self._same is None else self._same[self._low]
        # where each cell goes in an (n, n) array whose transpose (Fortran order) holds it in its
        # lower triangle: what dpotrf reads without a copy
        self._low_to_f = self._low[1] * n + self._low[0]
        self.last: list[np.ndarray] = []  # each chain's last state (log hyperparameters): a later start
        self.hypers = self._sample_hypers(n_hyper, burn, thin, chains, start)

    # --- the centred kernel --------------------------------------------------------------
    def _grid_moments(self, g: int, s: float) -> tuple[float, float]:
        """Of knob g's kernel at squared length scale s on its grid: mean_qq k(q, q'), and v, the
        centred kernel's mean variance there (see _centre)."""
        kqq, v = _grid_moments(self._dqq[g], np.array([s])[:, None, None], self.weights[g])
        return float(kqq[0]), float(v[0])

    def _grid_kernels(self, g: int, ls: float) -> tuple[np.ndarray, np.ndarray]:
        """Knob g's centred kernel (_centre) between its grid and the trials, and on its grid, at
        length scale ls: each kernel and each mean over the grid taken once."""
        s = ls * ls
        kqq, v = self._grid_moments(g, s)
        k_xq, k_qq = _m52(self._dxq[g] / s), _m52(self._dqq[g] / s)
        mx, mg = k_xq @ self.weights[g], k_qq @ self.weights[g]
        return _centre(k_xq.T, mg, mx, kqq, v), _centre(k_qq, mg, mg, kqq, v)

    def _per_knob_xx(self, h: Hyper) -> list[np.ndarray]:
        """Each knob's centred kernel between the trials at one draw's length scales:
        _centre of the trials' kernel and means, to rounding."""
        return [k[0] for k in self._knob_kernels(h.ls[None])]

    def _knob_kernels(self, ls: np.ndarray, lower: bool = False) -> list[np.ndarray]:
        """Each knob's centred kernel between the trials, (rows of `ls`, trials, trials), for each
        row of length scales `ls` (rows, knobs): the knobs of one grid at once, from the distances'
        roots; the (trials, trials) terms one knob at a time, so that they stay in cache. `lower`:
        the lower triangle's cells alone, (rows, cells), in `_low`'s order (the knobs of a grid
        together, half the size): the same values."""
        out: list[np.ndarray] = [np.empty(0)] * len(self.groups)
        for gs, rxx, rxq, rqq, w in self._low_roots if lower else self._roots:
            inv = 1.0 / ls[:, gs]  # (rows, knobs)
            kq = _m52t(rqq * inv[:, :, None, None])  # (rows, knobs, grid, grid)
            mq = kq @ w
            kqq = mq @ w
            v = np.maximum((np.diagonal(kq, axis1=2, axis2=3) - mq * mq / kqq[..., None]) @ w, 1e-9)
            m1 = (_m52t(rxq * inv[:, :, None, None]) @ w) / np.sqrt(kqq)[..., None]  # (rows, knobs, trials)
            if lower:  # the grid's knobs together: (rows, knobs, cells)
                kg = _m52t(rxx * inv[:, :, None])
                kg -= m1.take(self._low[0], axis=2) * m1.take(self._low[1], axis=2)
                kg /= v[:, :, None]
                for k, g in enumerate(gs):
                    out[g] = kg[:, k]
                continue
            for k, g in enumerate(gs):
                kg = _m52t(rxx[k] * inv[:, k, None, None])
                kg -= m1[:, k, :, None] * m1[:, k, None, :]
                kg /= v[:, k, None, None]
                out[g] = kg
        return out

    def _combine(self, ks: list[np.ndarray], h: Hyper) -> np.ndarray:
        """The kernel of the whole function from each knob's centred kernel ks[g]: the constant,
        the main effects and every pair's product."""
        out = h.main[0] * ks[0]
        out += h.const
        for g in range(1, len(ks)):
            out += h.main[g] * ks[g]
        for p, (i, j) in enumerate(self.pairs):
            out += h.pair[p] * (ks[i] * ks[j])
        return out

    def _noise(self, k: np.ndarray, h: Hyper) -> np.ndarray:
        """k plus the noise covariance of the rows: independent per row (extra + measured), and
        the offset each trial's rows share."""
        k[np.diag_indices(len(self.x))] += h.noise + self.known + JITTER
        if self._same is not None:
            k[:len(self.x), :len(self.x)] += h.cluster * self._same
        return k

    def _kxx(self, h: Hyper) -> np.ndarray:
        return self._noise(self._combine(self._per_knob_xx(h), h), h)

    # --- hyperparameters ---------------------------------------------------------------
    def _prior(self) -> tuple[np.ndarray, np.ndarray]:
        g, p = len(self.groups), len(self.pairs)
        main = math.log(1.0 / g)
        mean = [LOG_LS_PRIOR[0]] * g + [main] * g + [LOG_PAIR[0]] * p + [LOG_NOISE[0], LOG_CONST[0]]
        sd = [LOG_LS_PRIOR[1]] * g + [LOG_MAIN[1]] * g + [LOG_PAIR[1]] * p + [LOG_NOISE[1], LOG_CONST[1]]
        if self.cluster is not None:
            mean, sd = mean + [LOG_NOISE[0]], sd + [LOG_NOISE[1]]
        return np.array(mean), np.array(sd)

    def _unpack(self, theta: np.ndarray) -> Hyper:
        g, p = len(self.groups), len(self.pairs)
        e = np.exp(theta)
        k = 2 * g + p
        return Hyper(e[:g], e[g:2 * g], e[2 * g:k], float(e[k]), float(e[k + 1]),
                     float(e[k + 2]) if self.cluster is not None else 0.0)

    def _loglik_many(self, thetas: np.ndarray) -> np.ndarray:
        """The log marginal likelihood (up to its constant) at each row of `thetas` (log
        hyperparameters, as `_unpack` reads them), evaluated together: the chains advance in step,
        one likelihood each per round, so that numpy's per-call cost is paid once per round, not
        once per chain. -inf where the kernel is not positive definite."""
        n = len(self.x)
        step = max(1, BATCH_CELLS // len(self._low[0]))
        if len(thetas) > step:  # large kernels: a few at a time stay in cache
            return np.concatenate([self._loglik_many(thetas[i:i + step]) for i in range(0, len(thetas), step)])
        m, g, p = len(thetas), len(self.groups), len(self.pairs)
        e = np.exp(thetas)
        ls, main, pair = e[:, :g], e[:, g:2 * g], e[:, 2 * g:2 * g + p]
        noise, const = e[:, 2 * g + p], e[:, 2 * g + p + 1]
        ks = self._knob_kernels(ls, lower=True)  # (rows, cells): each kernel's lower triangle
        low = const[:, None] + main[:, 0, None] * ks[0]
        for gi in range(1, g):
            low += main[:, gi, None] * ks[gi]
        for q, (i, j) in enumerate(self.pairs):
            low += pair[:, q, None] * (ks[i] * ks[j])
        low[:, self._low_diag] += noise[:, None] + self.known + JITTER
        if self._low_same is not None:
            low += e[:, 2 * g + p + 2, None] * self._low_same
        kxx = np.empty((m, n, n))  # row c's kernel: kxx[c].T, its lower triangle (the rest unread)
        kxx.reshape(m, n * n)[:, self._low_to_f] = low
        out = np.full(m, -math.inf)
        for c in range(m):  # LAPACK directly: numpy's batched wrappers raise for all on one failure
            chol, info = dpotrf(kxx[c].T, lower=1, clean=0, overwrite_a=1)
            if info != 0:
                continue
            alpha, info = dtrtrs(chol, self.y, lower=1)
            ll = float(-0.5 * alpha @ alpha - np.log(np.diag(chol)).sum())
            if info == 0 and math.isfinite(ll):
                out[c] = ll
        return out

    def _sample_hypers(self, n: int, burn: int, thin: int, chains: int = 1,
                       start: np.ndarray | None = None) -> list[Hyper]:
        """Elliptical slice sampling under the Gaussian (log-space) prior (Murray et al. 2010), in
        `chains` chains that share the `n` draws: the first starts at the prior's median, the
        others at draws from the prior, so that a posterior with several modes (a knob's steep
        main effect against an interaction with a knob that happens to follow it in the trials) is
        not read from the one mode a single chain falls into first. `start` (chains x
        hyperparameters, as `last` holds them): where each chain starts instead, e.g. where a fit
        on nearly the same trials ended. Each chain has a random stream of its own and its own
        slice; they advance together, one likelihood each per round (`_loglik_many`)."""
        mean, sd = self._prior()
        d = len(mean)
        chains = max(1, min(chains, n))
        rngs = self.rng.spawn(chains)
        theta = np.empty((chains, d))
        for c in range(chains):
            if start is not None and len(start) > c and len(start[c]) == d:
                theta[c] = np.array(start[c], dtype=float)
            else:
                theta[c] = mean if c == 0 else mean + rngs[c].normal(0.0, 1.0, d) * sd
        total = [burn + (n // chains + (c < n % chains)) * thin for c in range(chains)]
        ll = self._loglik_many(theta)
        nu, level = np.zeros((chains, d)), np.zeros(chains)
        phi, lo, hi, tries, it = np.zeros(chains), np.zeros(chains), np.zeros(chains), [0] * chains, [0] * chains
        kept: list[list[Hyper]] = [[] for _ in range(chains)]

        def begin(c: int) -> None:  # a new iteration of chain c: its direction, level and bracket
            nu[c] = rngs[c].normal(0.0, 1.0, d) * sd
            level[c] = ll[c] + math.log(rngs[c].uniform())
            phi[c] = rngs[c].uniform(0.0, 2 * math.pi)
            lo[c], hi[c], tries[c] = phi[c] - 2 * math.pi, phi[c], 0

        active = [c for c in range(chains) if total[c] > 0]
        for c in active:
            begin(c)
        while active:
            idx = np.array(active)
            prop = mean + (theta[idx] - mean) * np.cos(phi[idx])[:, None] + nu[idx] * np.sin(phi[idx])[:, None]
            lp = self._loglik_many(prop)
            for k, c in enumerate(list(active)):
                tries[c] += 1
                if lp[k] > level[c]:
                    theta[c], ll[c] = prop[k], lp[k]
                elif tries[c] < 60:  # shrink the bracket towards the current state and try again
                    if phi[c] < 0:
                        lo[c] = phi[c]
                    else:
                        hi[c] = phi[c]
                    phi[c] = rngs[c].uniform(lo[c], hi[c])
                    continue
                if it[c] >= burn and (it[c] - burn) % thin == 0:
                    kept[c].append(self._unpack(theta[c].copy()))
                it[c] += 1
                if it[c] < total[c]:
                    begin(c)
                else:
                    active.remove(c)
        self.last = [theta[c].copy() for c in range(chains)]
        return [h for chain in kept for h in chain]

    # --- component draws -------------------------------------------------------------------
    def component_grid(self, comp: tuple[int, ...]) -> np.ndarray:
        """The grid of a component (one knob, or a pair: the product of their grids), as the
        indices of each knob's grid point: (points, len(comp))."""
        axes = [np.arange(len(self.grid[g])) for g in comp]
        return np.stack([a.ravel() for a in np.meshgrid(*axes, indexing="ij")], axis=1)

    def component_weights(self, comp: tuple[int, ...]) -> np.ndarray:
        """The quadrature weights of a component's grid points (component_grid's order), summing to
        one: a component's mean over the space is its weighted sum on the grid."""
        return _grid_rows([self.weights[g][:, None] for g in comp])[:, 0]

    def draws(self, per_hyper: int = 8) -> dict[tuple[int, ...], np.ndarray]:
        """Posterior draws of every component on its grid: {component: (draws, grid points)}, in
        standardised units (multiply by `sd` for y's). Components: (i,) per knob, (i, j) per pair."""
        comps = [(g,) for g in range(len(self.groups))] + list(self.pairs)
        out: dict[tuple[int, ...], list[np.ndarray]] = {c: [] for c in comps}
        n = len(self.x)
        for h in self.hypers:
            kx = self._per_knob_xx(h)
            kxx = self._noise(self._combine(kx, h), h)
            noise = h.noise + self.known
            try:
                chol = np.linalg.cholesky(kxx)
            except np.linalg.LinAlgError:
                continue
            # per knob: the centred kernel between grid and trials, grid and grid
            kqx, kqq = zip(*(self._grid_kernels(g, h.ls[g]) for g in range(len(self.groups))))
            # the constant term: one value per draw, the same at every trial
            prior_x = np.repeat(self.rng.normal(0.0, 1.0, (1, per_hyper)) * math.sqrt(h.const), n, axis=0)
            grids: dict[tuple[int, ...], np.ndarray] = {}
            crosses: dict[tuple[int, ...], np.ndarray] = {}
            for c in comps:
                var = h.main[c[0]] if len(c) == 1 else h.pair[self.pairs.index(c)]
                k_gg = kqq[c[0]] if len(c) == 1 else np.kron(kqq[c[0]], kqq[c[1]])
                k_gx = _grid_rows([kqx[g] for g in c])
                k_xx = np.prod([kx[g] for g in c], axis=0)
                joint = var * np.block([[k_gg, k_gx], [k_gx.T, k_xx]])
                draw = _mvn(joint, self.rng.normal(0.0, 1.0, (len(joint), per_hyper)))
                grids[c], crosses[c] = draw[:len(k_gx)], var * k_gx
                prior_x = prior_x + draw[len(k_gx):]
            eps = self.rng.normal(0.0, 1.0, (n, per_hyper)) * np.sqrt(noise)[:, None]
            if self.cluster is not None:  # the offset each trial's rows share
                eps = eps + self.rng.normal(0.0, 1.0, (self.cluster.max() + 1, per_hyper))[self.cluster] * math.sqrt(h.cluster)
            alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, self.y[:, None] - prior_x - eps))
            for c in comps:
                out[c].append((grids[c] + crosses[c] @ alpha).T)
        return {c: np.concatenate(v, axis=0) for c, v in out.items()}

    def mean(self) -> dict[tuple[int, ...], np.ndarray]:
        """The posterior mean of every component on its grid (standardised units), averaged over
        the hyperparameter draws."""
        comps = [(g,) for g in range(len(self.groups))] + list(self.pairs)
        acc = {c: 0.0 for c in comps}
        for h in self.hypers:
            alpha = np.linalg.solve(self._kxx(h), self.y)
            kqx = [self._grid_kernels(g, h.ls[g])[0] for g in range(len(self.groups))]
            for c in comps:
                var = h.main[c[0]] if len(c) == 1 else h.pair[self.pairs.index(c)]
                acc[c] = acc[c] + var * _grid_rows([kqx[g] for g in c]) @ alpha
        return {c: v / len(self.hypers) for c, v in acc.items()}

    def variance_reduction(self, points: np.ndarray, comps: list[tuple[int, ...]], *,
                           extra: np.ndarray | None = None) -> np.ndarray:
        """Per candidate point, how much observing it would shrink the posterior variance of the
        components `comps` (pairs of knobs: their interactions; (i,): a main effect), integrated
        over each component's grid, summed, in units of the function's variance over the space
        (a share), averaged over the hyperparameter draws: for a grid point g of component c,
        cov(f_c(g), y(p))^2 / var(y(p)), the exact one-point reduction (an integrated-variance
        design, Sacks et al. 1989), with y(p) the noisy value there. `extra`: configs to count
        as observed too (trials in flight: a GP's posterior variance does not depend on their
        values)."""
        xs = self.x if extra is None or not len(extra) else np.vstack([self.x, extra])
        knobs = range(len(self.groups))
        # per knob, the distances (the same for every hyperparameter draw): configs to configs,
        # candidates to configs, configs to the grid, candidates to the grid
        dist = [(_sqdist(xs[:, c], xs[:, c]), _sqdist(points[:, c], xs[:, c]), _sqdist(xs[:, c], self.grid[g]),
                 _sqdist(points[:, c], self.grid[g])) for g, c in enumerate(self.groups)]
        out = np.zeros(len(points))
        weights = {tuple(comp): self.component_weights(tuple(comp)) for comp in comps}
        for h in self.hypers:
            kx, kp, dp, kgp, kgx = [], [], [], [], []
            for g, (xx, px, xq, pq) in enumerate(dist):
                # the centred kernels (_centre) between configs, candidates and the grid, and its
                # variance at each candidate (_centre's diagonal): each kernel and each mean over
                # the grid taken once
                s = h.ls[g] * h.ls[g]
                kqq, v = self._grid_moments(g, s)
                k_xq, k_pq = _m52(xq / s), _m52(pq / s)
                w = self.weights[g]
                mx, mp, mg = k_xq @ w, k_pq @ w, _m52(self._dqq[g] / s) @ w
                kx.append(_centre(_m52(xx / s), mx, mx, kqq, v))
                kp.append(_centre(_m52(px / s), mp, mx, kqq, v))
                dp.append((1.0 - mp ** 2 / kqq) / v)
                kgp.append(_centre(k_pq.T, mg, mp, kqq, v))
                kgx.append(_centre(k_xq.T, mg, mx, kqq, v))
            kxx = self._noise(self._combine(kx, h), h)
            extra_noise = h.noise + self.known.mean() + (h.cluster if self.cluster is not None else 0.0)
            kxx[np.arange(len(self.x), len(xs)), np.arange(len(self.x), len(xs))] += extra_noise + JITTER
            # the whole function between the candidates and the observed configs, and its variance
            kf = h.const + sum(h.main[g] * kp[g] for g in knobs)
            vf = h.const + sum(h.main[g] * dp[g] for g in knobs)
            for p, (i, j) in enumerate(self.pairs):
                kf, vf = kf + h.pair[p] * kp[i] * kp[j], vf + h.pair[p] * dp[i] * dp[j]
            try:
                a = np.linalg.solve(kxx, kf.T)
            except np.linalg.LinAlgError:
                continue
            vy = np.maximum(vf - (kf * a.T).sum(1), 0.0) + extra_noise + JITTER
            total = float(h.main.sum() + h.pair.sum())
            for comp in comps:
                var = h.main[comp[0]] if len(comp) == 1 else h.pair[self.pairs.index(tuple(comp))]
                prior = var * _grid_rows([kgp[g] for g in comp])
                cross = var * _grid_rows([kgx[g] for g in comp])
                cov = prior - cross @ a  # (grid points, candidates): the posterior covariance
                out += weights[tuple(comp)] @ (cov * cov) / vy / total
        return out / max(len(self.hypers), 1)
