"""Synthetic studies with known truth, for judging the analyses: planted couplings, planted
laws, null (additive) objectives, seed noise."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pandas as pd

LAW_SPACE = {
    "W": {"low": 16.0, "high": 1024.0, "log": True},
    "sigma": {"low": 1e-3, "high": 1.0, "log": True},
    "lr": {"low": 1e-4, "high": 1e-1, "log": True},
    "decay": {"low": 0.0, "high": 1.0, "log": False},
}
UNIT_SPACE = {k: {"low": 0.0, "high": 1.0} for k in ("warm", "sigma", "lr", "decay")}


def frame(x: dict[str, np.ndarray], val: np.ndarray, *, sem: np.ndarray | None = None, n_seeds: int = 1) -> pd.DataFrame:
    """Trials as reports.trials_frame shapes them (all usable)."""
    df = pd.DataFrame(x)
    df.insert(0, "trial", range(len(df)))
    df.insert(1, "state", "COMPLETE")
    df.insert(2, "val_loss", val)
    df.insert(3, "peak_mem_mb", 1.0)
    df["outcome"] = "ok"
    df["n_seeds"] = n_seeds
    df["val_loss_std"] = np.nan if sem is None else sem * math.sqrt(n_seeds)
    df["val_loss_sem"] = np.nan if sem is None else sem
    return df


def power_law_study(seed: int, *, n: int = 150, alpha: float = -0.35, noise: float = 0.0,
                    n_seeds: int = 1) -> pd.DataFrame:
    """sigma*(W) = 0.05 · W^alpha planted in a 4-param space, plus additive nuisance terms;
    `noise` is the per-seed std of val_loss, the trial's value the mean of n_seeds seeds."""
    rng = np.random.default_rng(seed)
    x = {k: np.exp(rng.uniform(math.log(d["low"]), math.log(d["high"]), n)) if d["log"]
         else rng.uniform(d["low"], d["high"], n) for k, d in LAW_SPACE.items()}
    lsig_star = math.log(0.05) + alpha * np.log(x["W"])
    val = 0.3 * (np.log(x["sigma"]) - lsig_star) ** 2 + 0.2 * (np.log10(x["lr"]) + 2.5) ** 2 + 0.5 * x["decay"]
    sem = None
    if noise > 0:
        val = val + rng.normal(0, noise / math.sqrt(n_seeds), n)
        sem = np.full(n, noise / math.sqrt(n_seeds)) if n_seeds > 1 else None
    return frame(x, val, sem=sem, n_seeds=n_seeds)


def coupling_study(seed: int, *, n: int = 60, coupled: bool = True, noise: float = 0.05) -> pd.DataFrame:
    """warm × sigma interact when `coupled`; lr and decay always act alone."""
    rng = np.random.default_rng(seed)
    x = {k: rng.uniform(0, 1, n) for k in UNIT_SPACE}
    val = x["lr"] + 2 * (x["decay"] - 0.5) ** 2 + 0.5 * x["warm"] + 0.5 * x["sigma"]
    if coupled:
        val = val + 4 * (x["warm"] - 0.5) * (x["sigma"] - 0.5)
    return frame(x, val + rng.normal(0, noise, n))


def with_unsettled_runs(df: pd.DataFrame, seed: int, *, k: int = 1, label: str = "degrading") -> pd.DataFrame:
    """`k` trials turned into runs that never settled, as the health monitor labels them: val_loss
    5-12x the study's spread above its worst value, wherever they happened to be sampled."""
    rng = np.random.default_rng(10_000 + seed)
    df = df.copy()
    idx = rng.choice(len(df), k, replace=False)
    spread = float(df["val_loss"].max() - df["val_loss"].min())
    df["health"] = "ok"
    df.loc[idx, "val_loss"] = df["val_loss"].max() + spread * rng.uniform(5, 12, k)
    df.loc[idx, "health"] = label
    return df


FREEZE_CENTRES = {"embedding_only": -3.0, "attention_only": -2.0, "full": -1.5}


def categorical_study(seed: int, *, n: int = 80, noise: float = 0.02) -> pd.DataFrame:
    """The best lr depends on the freeze mode (10^-3, 10^-2, 10^-1.5): freeze x lr coupled;
    decay acts alone; targets x init_from interact (categorical x categorical)."""
    rng = np.random.default_rng(seed)
    modes = list(FREEZE_CENTRES)
    x = {"freeze": rng.choice(modes, n), "lr": np.exp(rng.uniform(math.log(1e-4), math.log(1e-1), n)),
         "decay": rng.uniform(0, 1, n), "targets": rng.choice(["unet", "text"], n),
         "init_from": rng.choice(["random", "word:cat"], n)}
    centre = np.array([FREEZE_CENTRES[m] for m in x["freeze"]])
    val = (np.log10(x["lr"]) - centre) ** 2 + 0.5 * x["decay"]
    val = val + 2.0 * ((x["targets"] == "unet") == (x["init_from"] == "random"))
    return frame(x, val + rng.normal(0, noise, n))


def moderate_study(seed: int, *, n: int = 20, coupled: bool = True, share: float = 0.12, snr: float = 2.8,
                   n_seeds: int = 1, x: dict[str, np.ndarray] | None = None) -> pd.DataFrame:
    """Four knobs on [0, 1]: warm and sigma act alone and, when `coupled`, also through a pure
    interaction carrying `share` of the noise-free variance; lr (curved) and decay (linear) act
    alone beside them. Seed noise so that the configs' spread is `snr` times it; the trial's
    value is the mean of `n_seeds` seeds. `x`: the configs (else uniform at random)."""
    rng = np.random.default_rng(seed)
    x = x if x is not None else {k: rng.uniform(0, 1, n) for k in UNIT_SPACE}
    n = len(x["warm"])
    additive = 3 * (1 / 48) + 4 / 180  # variances of the three linear terms and the curved one
    c5 = math.sqrt(144 * share * additive / (1 - share)) if coupled else 0.0
    total = additive + c5**2 / 144
    noise = math.sqrt(total) / snr
    val = (0.5 * (x["warm"] - 0.5) + 0.5 * (x["sigma"] - 0.5) + 2 * (x["lr"] - 0.5) ** 2 + 0.5 * x["decay"]
           + c5 * (x["warm"] - 0.5) * (x["sigma"] - 0.5))
    val = val + rng.normal(0, noise / math.sqrt(n_seeds), n)
    sem = np.full(n, noise / math.sqrt(n_seeds)) if n_seeds > 1 else None
    return frame(x, val, sem=sem, n_seeds=n_seeds)


def true_share(share: float = 0.12) -> float:
    return share


def designed_moderate_study(seed: int, n: int, *, n_seeds: int = 1, seed_plan: str = "every",
                            diverges: Any = None, diverged_state: Any = None,
                            **planting: Any) -> pd.DataFrame:
    """The moderate planting (`planting`: moderate_study's `coupled`, `share`, `snr`) on configs
    the coupling design (`--sampler coupling`) picks, in Optuna's ask/tell loop, one trial at a
    time; with `n_seeds` > 1 each trial's value is the mean of its seeds and its replicate
    standard error is the trial's known noise, as `--seeds K` gives it. `seed_plan="design"`:
    n x n_seeds runs, as many seeds per trial as the design gives it (`--seed-plan design`).
    `diverges(params)`: True where a run diverges: that trial is PRUNED, as the divergence stop
    leaves it (or `diverged_state`: FAIL, as a run that raised), and only the usable trials are
    returned (`.attrs["pruned"]`: how many were not)."""
    import optuna

    from common.attrs import N_SEEDS, VAL_LOSS_SEM
    from sweeps import CouplingSampler

    space = {name: optuna.distributions.FloatDistribution(0.0, 1.0) for name in UNIT_SPACE}
    sampler = CouplingSampler(seed=seed)
    study = optuna.create_study(sampler=sampler)
    rows, runs, i, pruned = [], n * n_seeds, 0, 0
    while runs > 0:
        t = study.ask(space)
        k = n_seeds if seed_plan == "every" else min(sampler.seeds_for(t, n_seeds), runs)
        if diverges is not None and diverges(t.params):
            study.tell(t, state=diverged_state or optuna.trial.TrialState.PRUNED)
            runs, i, pruned = runs - k, i + 1, pruned + 1
            continue
        row = moderate_study(seed * 1000 + i, n=1, x={p: np.array([t.params[p]]) for p in UNIT_SPACE},
                             n_seeds=k, **planting)
        if k > 1:
            t.set_user_attr(VAL_LOSS_SEM, float(row["val_loss_sem"].iloc[0]))
        t.set_user_attr(N_SEEDS, k)
        study.tell(t, float(row["val_loss"].iloc[0]))
        rows.append(row)
        runs, i = runs - k, i + 1
    out = pd.concat(rows, ignore_index=True)
    out["trial"] = range(len(out))
    out.attrs["pruned"] = pruned
    return out


# A plug-in objective with a curve (`csweep run --early-stop dominated`, `--score best`): written
# into a test's or a benchmark's project as `curves.py`. Known truth: loss falls towards a floor
# set by lr and rank at a rate set by lr, and a high lr overfits (the curve turns up after its
# best step); memory grows with rank, so rank trades memory for loss (the front). Seed noise: an
# offset per (config, seed) and a small jitter per point.
CURVE_PLUGIN = '''
import hashlib
import itertools
import math
import time


def _gauss(key, scale):
    h = hashlib.sha1(repr(key).encode()).digest()
    u1, u2 = (int.from_bytes(h[i:i + 4], "big") / 2**32 for i in (0, 4))
    return scale * math.sqrt(-2 * math.log(max(u1, 1e-12))) * math.cos(2 * math.pi * u2)


def truth(lr, rank, step):
    """The noise-free val_loss of (lr, rank) after `step` steps."""
    u = math.log10(lr) + 2.0  # 0 at lr = 1e-2
    floor = 0.2 + 0.08 * u * u - 0.03 * math.log2(rank)
    rate = 0.06 * 10 ** (0.5 * u)
    over = 0.0015 * max(0.0, step - 60 / 10 ** (0.5 * u)) * max(0.0, u + 0.5)
    return floor + (1.0 - floor) * math.exp(-rate * step) + over


def objective(params):
    lr, rank, steps = float(params["lr"]), int(params["rank"]), int(params["steps"])
    every, seed = int(params.get("val_every", 10)), int(params.get("seed", 0)) + 1000 * int(params.get("salt", 0))
    noise, pause = float(params.get("noise", 0.01)), float(params.get("step_seconds", 0.0))
    mem = 100.0 + 12.0 * rank
    config = (round(lr, 12), rank)
    offset = _gauss((config, seed, "offset"), noise)
    value = truth(lr, rank, 0) + offset
    yield {"step": 0, "val_loss": value, "peak_mem_mb": mem}
    for step in range(1, steps + 1):
        if pause:
            time.sleep(pause)
        if step % every == 0 or step == steps:
            value = truth(lr, rank, step) + offset + _gauss((config, seed, step), noise / 4)
            yield {"step": step, "val_loss": value, "peak_mem_mb": mem}
    return {"val_loss": value, "peak_mem_mb": mem, "steps_trained": float(steps)}
'''

CURVE_SPACE = """name: curves
objective: curves:objective
params:
  lr: {type: float, low: 1.0e-4, high: 1.0e-1, log: true}
  rank: {type: int, low: 1, high: 16, log: true}
fixed:
  steps: 90
  val_every: 10
"""


STEPS_SPACE = {"steps": {"low": 20.0, "high": 200.0, "log": False},
               "lr": {"low": 1e-3, "high": 1e-1, "log": True},
               "decay": {"low": 0.0, "high": 1.0, "log": False}}


def steps_study(seed: int, *, n: int = 20, alpha: float = -0.5, trial_noise: float = 0.03,
                point_noise: float = 0.01, every: int = 10) -> tuple[pd.DataFrame, dict[int, list[tuple[int, float]]]]:
    """A study over `steps` with curves: the best lr at s steps is lr*(s) = 0.02 (s / 20)^alpha
    (alpha = 0: no coupling of steps and lr), the loss also falls with s on its own and decay acts
    alone. Seed noise: an offset per trial shared by its whole curve (trial_noise) and a jitter
    per validation (point_noise). Returns (trials as reports.trials_frame shapes them, each with
    its own steps' value; {trial: [(step, val_loss), ...]} validated every `every` steps)."""
    rng = np.random.default_rng(seed)
    d = STEPS_SPACE
    steps = rng.integers(int(d["steps"]["low"]), int(d["steps"]["high"]) + 1, n)
    lr = np.exp(rng.uniform(math.log(d["lr"]["low"]), math.log(d["lr"]["high"]), n))
    decay = rng.uniform(0, 1, n)

    def truth(s: float, lr_: float, dec: float) -> float:
        best = math.log(0.02) + alpha * math.log(s / 20)
        return 0.15 * (math.log(lr_) - best) ** 2 + 0.5 * math.exp(-s / 60) + 0.2 * dec

    curves, final = {}, []
    for t in range(n):
        offset = rng.normal(0, trial_noise)
        points = [int(s) for s in range(every, int(steps[t]) + 1, every)]
        if not points or points[-1] != int(steps[t]):
            points.append(int(steps[t]))
        curves[t] = [(s, truth(s, lr[t], decay[t]) + offset + rng.normal(0, point_noise)) for s in points]
        final.append(curves[t][-1][1])
    return frame({"steps": steps.astype(float), "lr": lr, "decay": decay}, np.array(final)), curves


# --- planted stability boundaries ----------------------------------------------------------
# Four knobs as a LoRA study has them: lr (log), lora_rank (int 0-16), warmup (0-1) and decay
# (0-1). Runs above an lr ceiling diverge: a band of BOUNDARY_WIDTH decades where a run's seed
# decides. Where runs converge the loss is additive (no loss coupling anywhere).
BOUNDARY_SPACE = {"lr": {"low": 1e-4, "high": 1e-1, "log": True, "step": None},
                  "lora_rank": {"low": 0, "high": 16, "log": False, "step": 1},
                  "warmup": {"low": 0.0, "high": 1.0, "log": False, "step": None},
                  "decay": {"low": 0.0, "high": 1.0, "log": False, "step": None}}
BOUNDARY_WIDTH = 0.08  # decades of lr over which P(diverge) goes from 27% to 73%
BOUNDARY_BETA = -1.0  # "rank": lr_max = 0.02 (1 + rank)^-1 (17x across the ranks)
FREEZE_CEILINGS = {"embedding_only": 0.03, "attention_only": 0.006, "full": 0.0015}
# planted kind -> the pairs whose boundary moves
BOUNDARY_TRUTH = {"rank": {("lr", "lora_rank")}, "lr": set(), "freeze": {("lr", "freeze")},
                  "rank-warmup": {("lr", "lora_rank"), ("lr", "warmup")}}


def lr_ceiling(kind: str, params: dict[str, Any]) -> float:
    if kind == "rank":
        return 0.02 * (1 + params["lora_rank"]) ** BOUNDARY_BETA
    if kind == "rank-warmup":
        return 0.02 * (1 + params["lora_rank"]) ** BOUNDARY_BETA * 8 ** (params["warmup"] - 0.5)
    if kind == "freeze":
        return FREEZE_CEILINGS[params["freeze"]]
    return 0.004


def boundary_space(kind: str) -> dict[str, dict[str, Any]]:
    space = dict(BOUNDARY_SPACE)
    if kind == "freeze":
        del space["lora_rank"]
    return space


def boundary_run(kind: str, params: dict[str, Any], rng: np.random.Generator, *, noise: float = 0.01
                 ) -> tuple[float, str]:
    """(val_loss, health) of one run of the planted boundary objective."""
    over = (math.log10(params["lr"]) - math.log10(lr_ceiling(kind, params))) / BOUNDARY_WIDTH
    if rng.random() < 1 / (1 + math.exp(-over)):
        return 1.0 + rng.uniform(0, 0.5), "diverged"
    val = (0.1 + 0.02 * (math.log10(params["lr"]) + 2.5) ** 2 + 0.02 * params["decay"]
           + 0.01 * params.get("lora_rank", 0) / 16 + 0.01 * params["warmup"])
    return val + rng.normal(0, noise), "ok"


def boundary_study(seed: int, *, n: int = 40, kind: str = "rank", sampler: str = "random",
                   warm_start: bool = True) -> pd.DataFrame:
    """A study of the planted boundary objective in Optuna's ask/tell loop with `sampler`
    (random, qmc, coupling; `warm_start` its chains), a diverged run COMPLETE with `health:
    diverged` as a plug-in tags it; returned as reports.trials_frame shapes the trials."""
    import optuna

    from common.attrs import HEALTH
    from sweeps import CouplingSampler

    dists: dict[str, Any] = {}
    for name, d in boundary_space(kind).items():
        if d["step"]:
            dists[name] = optuna.distributions.IntDistribution(int(d["low"]), int(d["high"]))
        else:
            dists[name] = optuna.distributions.FloatDistribution(d["low"], d["high"], log=d["log"])
    if kind == "freeze":
        dists["freeze"] = optuna.distributions.CategoricalDistribution(list(FREEZE_CEILINGS))
    make = {"random": lambda: optuna.samplers.RandomSampler(seed=seed),
            "qmc": lambda: optuna.samplers.QMCSampler(seed=seed, warn_independent_sampling=False),
            "coupling": lambda: CouplingSampler(seed=seed, warm_start=warm_start)}[sampler]
    study = optuna.create_study(sampler=make(), directions=["minimize", "minimize"])
    rng = np.random.default_rng(seed + 7919)
    rows = []
    for i in range(n):
        t = study.ask(dists)
        val, health = boundary_run(kind, t.params, rng)
        t.set_user_attr(HEALTH, health)
        study.tell(t, [val, 1.0])
        rows.append({"trial": i, "state": "COMPLETE", "val_loss": val, "peak_mem_mb": 1.0, **t.params,
                     "outcome": "ok", "n_seeds": 1, "health": health})
    return pd.DataFrame(rows)


# --- test functions of the sensitivity-analysis literature, with their published indices ------
ISHIGAMI_RANGE = (-math.pi, math.pi)
ISHIGAMI_S2 = {(0, 1): 0.0, (0, 2): 0.2437, (1, 2): 0.0}  # a = 7, b = 0.1 (Ishigami & Homma 1990)


def ishigami(x1, x2, x3, a: float = 7.0, b: float = 0.1):
    """Ishigami's function on [-pi, pi]^3: second-order indices ISHIGAMI_S2."""
    return np.sin(x1) + a * np.sin(x2) ** 2 + b * x3 ** 4 * np.sin(x1)


G_A = (0.0, 1.0, 4.5)


def g_function(*xs):
    """Sobol's G function with a = G_A on [0, 1]^3 (g_exact: its second-order indices)."""
    out = 1.0
    for x, a in zip(xs, G_A):
        out = out * (np.abs(4 * x - 2) + a) / (1 + a)
    return out


def g_exact() -> dict[tuple[int, int], float]:
    """Sobol's G's second-order indices: S_ij = V_i V_j / V, V_i = 1 / (3 (1 + a_i)^2),
    V = prod(1 + V_i) - 1."""
    v = [1 / (3 * (1 + a) ** 2) for a in G_A]
    total = np.prod([1 + vi for vi in v]) - 1
    return {(i, j): float(v[i] * v[j] / total) for i, j in itertools.combinations(range(3), 2)}


def pair_shares(f, lo: float, hi: float, nodes01: np.ndarray, w: np.ndarray) -> dict[tuple[int, int], float]:
    """Every pair's pure interaction variance over the total of a three-knob function `f` on
    [lo, hi]^3, on the tensor grid of `nodes01` (in [0, 1]) with weights `w` (summing to one)."""
    x = lo + (hi - lo) * nodes01
    values = f(*np.meshgrid(x, x, x, indexing="ij"))
    mean = np.einsum("ijk,i,j,k->", values, w, w, w)
    var = np.einsum("ijk,i,j,k->", (values - mean) ** 2, w, w, w)
    mains = [np.einsum("ijk,j,k->i", values, w, w) - mean, np.einsum("ijk,i,k->j", values, w, w) - mean,
             np.einsum("ijk,i,j->k", values, w, w) - mean]
    out = {}
    for (i, j), axis in (((0, 1), "ijk,k->ij"), ((0, 2), "ijk,j->ik"), ((1, 2), "ijk,i->jk")):
        pair = np.einsum(axis, values, w) - mean - mains[i][:, None] - mains[j][None, :]
        out[(i, j)] = float(np.einsum("ab,a,b->", pair ** 2, w, w) / var)
    return out
