"""The kernel algebra under common.gp: the Matern 5/2 kernel (of squared distances, or of the
chains' scaled distances), squared distances, a knob's grid moments and its centred kernel (the
orthogonal ANOVA component), a component's rows on its grid, and Gaussian draws of a covariance."""

from __future__ import annotations

import math

import numpy as np

SQRT5 = math.sqrt(5.0)


def _m52(d2: np.ndarray) -> np.ndarray:
    r = np.sqrt(np.maximum(d2, 0.0))
    return (1.0 + SQRT5 * r + (5.0 / 3.0) * d2) * np.exp(-SQRT5 * r)


def _m52t(t: np.ndarray) -> np.ndarray:
    """The Matern 5/2 kernel of t = sqrt(5) r / l (the chains' form: distances' roots taken once)."""
    out = np.exp(-t)
    poly = t * t
    poly *= 1.0 / 3.0
    poly += t
    poly += 1.0
    out *= poly
    return out


def _sqdist(x1: np.ndarray, x2: np.ndarray) -> np.ndarray:
    return np.maximum((x1 * x1).sum(1)[:, None] + (x2 * x2).sum(1)[None, :] - 2.0 * x1 @ x2.T, 0.0)


def _grid_moments(dqq: np.ndarray, s: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Of a grid's kernel (squared distances `dqq`, weights `w`) at each squared length scale of
    `s` (shape (m, 1, 1)): mean_qq k(q, q') and v, the centred kernel's mean variance there
    (_centre)."""
    kq = _m52(dqq[None] / s)
    mq = kq @ w
    kqq = mq @ w
    return kqq, np.maximum((np.diagonal(kq, axis1=1, axis2=2) - mq * mq / kqq[:, None]) @ w, 1e-9)


def _centre(k: np.ndarray, m1: np.ndarray, m2: np.ndarray, kqq: float, v: float) -> np.ndarray:
    """A knob's centred kernel k~(p1, p2) = (k(p1, p2) - m1(p1) m2(p2) / kqq) / v from its kernel k
    between two sets of points, each set's mean kernel to the grid (m(p) = mean_q k(p, q), the mean
    under the grid's weights), the grid's mean kernel kqq = mean_qq k(q, q') and v, the centred
    kernel's mean variance over the grid (_grid_moments). v makes a component's variance over the
    space its own hyperparameter whatever its smoothness (a smooth centred draw varies little:
    without v, long length scales would shrink every interaction and the prior on a pair's share
    would lean towards "no sign")."""
    return (k - np.outer(m1, m2) / kqq) / v


def _grid_rows(ks: list[np.ndarray]) -> np.ndarray:
    """A component's kernel rows on its grid from its knobs' rows on theirs: what
    np.prod([k[idx[:, a]] for a, k in enumerate(ks)], axis=0) gives for the component's grid idx
    (BayesGP.component_grid: the knobs' grid points in 'ij' order), the same products, without
    gathering each knob's rows to the grid's size first."""
    out = ks[0]
    for k in ks[1:]:
        out = (out[:, None, :] * k[None, :, :]).reshape(-1, k.shape[-1])
    return out


def _mvn(cov: np.ndarray, z: np.ndarray) -> np.ndarray:
    """Draws with covariance `cov` from standard normal columns `z`: by Cholesky with a small
    jitter, by eigendecomposition where that fails (a centred kernel is singular on its grid)."""
    scale = max(float(np.mean(np.diag(cov))), 1e-12)
    try:
        return np.linalg.cholesky(cov + np.eye(len(cov)) * 1e-6 * scale) @ z
    except np.linalg.LinAlgError:
        vals, vecs = np.linalg.eigh(cov)
        return (vecs * np.sqrt(np.clip(vals, 0.0, None))) @ z
