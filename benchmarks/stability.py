"""Stability verdicts against planted boundaries, through `csweep run` itself.

A plug-in objective where runs above an lr ceiling diverge (tagged `health: diverged`, as a
plug-in says it; a band of 0.08 decades where the run's seed decides) and the loss is additive
where they converge (tests/synthetic.py: lr_ceiling, boundary_run). Planted kinds:

- `rank`: lr_max = 0.02 (1 + lora_rank)^-1 (17x across ranks 0-16); warmup and decay move nothing;
- `lr`: lr_max = 0.004 whatever the other knobs (no pair moves it);
- `freeze`: a categorical knob sets it (0.03, 0.006, 0.0015 for its three levels);
- `rank-warmup`: rank as in `rank`, and warmup raises it 8x across its range.

About half of each space diverges. Each (kind, sampler, seed) is one study of the largest size
run by `sweeps.main` (Optuna storage, Ray workers, MLflow); the smaller sizes are its first
trials. Per cell: the moved pairs' verdicts (coupled / inconclusive / no sign), the unmoved
pairs', how often the law's interval covers the planted exponent (rank, where a law is stated),
the ratio's direction, and the share of the study's runs that diverged.

    python benchmarks/stability.py                                  # the table in RESULTS.md
    python benchmarks/stability.py --kinds rank --samplers coupling,random,qmc --studies 10
    python benchmarks/stability.py --in-process                     # Optuna ask/tell, no Ray (fast)
    python benchmarks/stability.py --in-process --method bootstrap  # the alternative model
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

PLUGIN = '''
import random

from boundsyn import boundary_run  # tests/synthetic.py, copied beside this file


def objective(params):
    rng = random.Random(repr(sorted((k, v) for k, v in params.items())))
    val, health = boundary_run(params["kind"], params, _Rng(rng))
    return {"val_loss": val, "peak_mem_mb": 10.0 + params.get("lora_rank", 0), "tags": {"health": health}}


class _Rng:
    def __init__(self, rng):
        self.rng = rng

    def random(self):
        return self.rng.random()

    def uniform(self, a, b):
        return self.rng.uniform(a, b)

    def normal(self, m, s):
        return self.rng.gauss(m, s)
'''


def write_plugin(project: Path) -> None:
    (project / "boundobj.py").write_text(PLUGIN)
    (project / "boundsyn.py").write_text((ROOT / "tests" / "synthetic.py").read_text())


def space_yaml(kind: str) -> str:
    lines = [f"name: 'bound-{kind}'", "objective: boundobj:objective", "params:",
             "  lr: {type: float, low: 1.0e-4, high: 1.0e-1, log: true}"]
    if kind != "freeze":
        lines.append("  lora_rank: {type: int, low: 0, high: 16}")
    else:
        lines.append("  freeze: {type: categorical, choices: [embedding_only, attention_only, full]}")
    lines += ["  warmup: {type: float, low: 0.0, high: 1.0}", "  decay: {type: float, low: 0.0, high: 1.0}",
              "fixed:", f"  kind: {kind}"]
    return "\n".join(lines) + "\n"


def run_study(project: Path, kind: str, sampler: str, seed: int, trials: int) -> object:
    import optuna

    from sweeps import main

    study = f"bound-{kind}-{sampler}-{seed}"
    here = os.getcwd()
    os.chdir(project)
    err = io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            rc = main(["run", f"{kind}.yaml", "--study", study, "--trials", str(trials), "--workers", "1",
                       "--sampler", sampler, "--seed", str(seed), "--no-progress"])
    finally:
        os.chdir(here)
    assert rc == 0, (kind, sampler, seed, rc, err.getvalue()[-500:])
    return optuna.load_study(study_name=study, storage=f"sqlite:///{project / 'csweep_runs/optuna.db'}")


def bootstrap_analysis(runs, numeric, categorical, seed):  # noqa: ANN001, ANN201 - the alternative measured
    """The alternative model: the same statistic from 200 bootstrap refits of scikit-learn's
    L2-penalised logistic regression (C = 1) instead of the Bayesian posterior."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression

    import reports._stability as S

    real = S.posterior_draws

    def draws(x, y, *, seed=0, **_):  # noqa: ANN001, ANN202
        rng = np.random.default_rng(seed)
        out = []
        for _ in range(200):
            idx = rng.integers(0, len(y), len(y))
            if 0 < y[idx].sum() < len(idx):
                f = LogisticRegression(C=1.0, max_iter=2000).fit(x[idx], y[idx])
                out.append(np.r_[f.intercept_, f.coef_.ravel()])
        return np.array(out)

    S.posterior_draws = draws
    try:
        return S.stability_analysis(runs, numeric, categorical=categorical, seed=seed)
    finally:
        S.posterior_draws = real


def score(runs, numeric: dict, categorical: dict, kind: str, seed: int, method: str) -> dict:
    import synthetic as T

    from reports import stability_analysis

    truth = {frozenset(p) for p in T.BOUNDARY_TRUTH[kind]}
    res = (bootstrap_analysis(runs, numeric, categorical, seed) if method == "bootstrap"
           else stability_analysis(runs, numeric, categorical=categorical, seed=seed))
    out = {"moved": [0, 0, 0], "still": [0, 0, 0], "cover": [0, 0], "direction": [0, 0]}
    seen = set()
    for b in res.boundaries:
        key = frozenset((b.param, b.by))
        if b.param == "lr" and key in truth and b.verdict_key == "coupled":
            out["direction"][1] += 1
            falls = {"lora_rank": True, "warmup": False}.get(b.by)
            out["direction"][0] += (b.ratio < 1) == falls if falls is not None else b.ratio > 1
        if b.param == "lr" and b.by == "lora_rank" and b.law is not None:
            out["cover"][1] += 1
            out["cover"][0] += b.law.beta_ci_low <= T.BOUNDARY_BETA <= b.law.beta_ci_high
        if key in seen:
            continue
        seen.add(key)
        idx = {"coupled": 0, "inconclusive": 1, "no sign of coupling": 2}[b.verdict_key]
        out["moved" if key in truth else "still"][idx] += 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--studies", type=int, default=10)
    ap.add_argument("--sizes", default="20,30,40")
    ap.add_argument("--samplers", default="coupling,random,qmc")
    ap.add_argument("--kinds", default="rank,lr,freeze")
    ap.add_argument("--in-process", action="store_true", help="Optuna ask/tell in this process (no Ray, no MLflow)")
    ap.add_argument("--method", default="bayes", choices=["bayes", "bootstrap"])
    a = ap.parse_args()
    warnings.filterwarnings("ignore")
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    import synthetic as T

    from reports import categorical_params, numeric_params, stability_runs_of

    sizes = [int(v) for v in a.sizes.split(",")]
    project = Path(tempfile.mkdtemp(prefix="csweep-stability-"))
    write_plugin(project)
    sys.path.insert(0, str(project))
    for kind in a.kinds.split(","):
        (project / f"{kind}.yaml").write_text(space_yaml(kind))
    print(f"{a.studies} seeded studies per cell ({'in-process' if a.in_process else 'csweep run'}, {a.method}); "
          "moved pairs and unmoved pairs: coupled/inconclusive/no sign; law: interval covers the planted exponent; "
          "direction: the ratio's sign right; diverged: share of the runs", flush=True)
    t0 = time.time()
    for kind in a.kinds.split(","):
        for sampler in a.samplers.split(","):
            cells = {n: {"moved": [0, 0, 0], "still": [0, 0, 0], "cover": [0, 0], "direction": [0, 0], "div": 0.0}
                     for n in sizes}
            for seed in range(a.studies):
                if a.in_process:
                    df = T.boundary_study(seed, n=max(sizes), kind=kind, sampler=sampler)
                    numeric = T.boundary_space(kind)
                    categorical = {"freeze": list(T.FREEZE_CEILINGS)} if kind == "freeze" else {}
                    from reports import stability_runs

                    all_runs = stability_runs(df)
                else:
                    study = run_study(project, kind, sampler, seed, max(sizes))
                    numeric, categorical = numeric_params(study), categorical_params(study)
                    all_runs = stability_runs_of(study)
                for n in sizes:
                    runs = all_runs[all_runs["trial"] < n]
                    got = score(runs, numeric, categorical, kind, seed, a.method)
                    for k in ("moved", "still", "cover", "direction"):
                        cells[n][k] = [x + y for x, y in zip(cells[n][k], got[k])]
                    cells[n]["div"] += float(runs["unstable"].mean()) / a.studies
            for n in sizes:
                c = cells[n]
                print(f"{kind:<12} {sampler:<9} n={n:<3} moved {'/'.join(map(str, c['moved'])):>8}  "
                      f"unmoved {'/'.join(map(str, c['still'])):>9}  law {c['cover'][0]}/{c['cover'][1]}  "
                      f"direction {c['direction'][0]}/{c['direction'][1]}  diverged {c['div']:.0%}", flush=True)
    print(f"{time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
