"""Coupling verdicts against known truth, per sampler and study size, through `csweep run` itself.

Seeded studies of synthetic plug-in objectives (four knobs on [0, 1]; a categorical one for
`catnum` and `catnum-fails`, where a region of it raises) run by `sweeps.main` (the real path:
Optuna storage, Ray workers, MLflow), one study per (objective, sampler, seed) at the largest size;
the smaller sizes are the study's first trials (with one worker a seeded sampler's first N trials
are those an N-trial study would have run). Each pair's verdict from the report's analysis
(reports.coupling_analysis, the usable trials) is scored against the truth: the planted pair should
read "coupled", every other "no sign".

    python benchmarks/verdicts.py                       # the table in benchmarks/RESULTS.md
    python benchmarks/verdicts.py --studies 10 --sizes 12,20,30,60 --samplers random,qmc,tpe,coupling

Prints per cell: correct-decisive / inconclusive / wrong, over all pairs of all studies, and the
planted pair's own row (coupled / inconclusive / no sign), which is the figure users ask for.

Sampler `coupling-plan`: `--sampler coupling --seeds 2 --seed-plan design`, its cell `n=N` the
N x 2 training runs of `--trials N` (2 seeds on each of the design's first 2 x knobs + 2 configs,
one on each after): twice the runs of the other samplers' cells.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PLUGIN = '''
import hashlib
import math

CENTRES = {"embedding_only": 0.2, "attention_only": 0.5, "full": 0.8}


def _noise(params, scale):
    key = repr(sorted((k, v) for k, v in params.items() if k != "kind")).encode()
    h = hashlib.sha1(key).digest()
    u1, u2 = (int.from_bytes(h[i:i + 4], "big") / 2**32 for i in (0, 4))
    return scale * math.sqrt(-2 * math.log(max(u1, 1e-12))) * math.cos(2 * math.pi * u2)


def objective(params):
    kind, snr = params["kind"], params["snr"]
    w, s, lr, d = (params[k] for k in ("warm", "sigma", "lr", "decay"))
    additive = 3 * (1 / 48) + 4 / 180
    if kind == "catnum":
        if params.get("fails") and params["freeze"] == "full" and lr > 0.6:
            raise RuntimeError("the run diverged")  # a FAIL trial, as a run that raised leaves it
        c = CENTRES[params["freeze"]]
        val = 4 * (lr - c) ** 2 + 0.5 * (w - 0.5) + 0.5 * d
        total = 0.05
    else:
        share = {"moderate": 0.12, "strong": 0.4, "none": 0.0}[kind]
        c5 = math.sqrt(144 * share * additive / (1 - share))
        total = additive + c5 ** 2 / 144
        val = (0.5 * (w - 0.5) + 0.5 * (s - 0.5) + 2 * (lr - 0.5) ** 2 + 0.5 * d
               + c5 * (w - 0.5) * (s - 0.5))
    return {"val_loss": val + _noise(params, math.sqrt(total) / snr), "peak_mem_mb": 10 + 5 * d}
'''

KNOBS = {k: "{type: float, low: 0.0, high: 1.0}" for k in ("warm", "sigma", "lr", "decay")}
OBJECTIVES = {  # name: (kind, snr, planted pair)
    "moderate": ("moderate", 2.8, ("warm", "sigma")),
    "moderate-noisy": ("moderate", 1.4, ("warm", "sigma")),
    "moderate-quiet": ("moderate", 7.0, ("warm", "sigma")),  # 40% of moderate's noise
    "strong": ("strong", 2.8, ("warm", "sigma")),
    "null": ("none", 2.8, None),
    "catnum": ("catnum", 2.8, ("freeze", "lr")),
    # catnum where runs with freeze = full and lr > 0.6 raise (13% of the space, over full's best lr)
    "catnum-fails": ("catnum", 2.8, ("freeze", "lr")),
}


def space_yaml(name: str) -> str:
    kind, snr, _ = OBJECTIVES[name]
    params = dict(KNOBS)
    if kind == "catnum":
        del params["sigma"]
        params["freeze"] = "{type: categorical, choices: [embedding_only, attention_only, full]}"
    lines = [f"name: '{name}'", "objective: verdictobj:objective", "params:"]
    lines += [f"  {k}: {v}" for k, v in params.items()]
    lines += ["fixed:", f"  kind: {kind}", f"  snr: {snr}", "  sigma: 0.5" if kind == "catnum" else ""]
    lines += ["  fails: true"] if name.endswith("-fails") else []
    return "\n".join(lines) + "\n"


PLAN_SEEDS = 2


def plan_trials(n: int, knobs: int = 4) -> int:
    """The trials `--trials n --seeds 2 --seed-plan design` runs: 2 seeds on the start, 1 after."""
    from sweeps._coupling_sampler import default_startup

    start = min(n, default_startup(knobs))
    return start + (n - start) * PLAN_SEEDS


def run_study(project: Path, name: str, sampler: str, seed: int, trials: int) -> object:
    import optuna

    from sweeps import main

    study = f"{name}-{sampler}-{seed}"
    extra = []
    if sampler == "coupling-plan":
        sampler, extra = "coupling", ["--seeds", str(PLAN_SEEDS), "--seed-plan", "design"]
    here = os.getcwd()
    os.chdir(project)
    err = io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            rc = main(["run", f"{name}.yaml", "--study", study, "--trials", str(trials), "--workers", "1",
                       "--sampler", sampler, "--seed", str(seed), "--no-progress", *extra])
    finally:
        os.chdir(here)
    assert rc == 0, (name, sampler, seed, rc, err.getvalue()[-500:])
    return optuna.load_study(study_name=study, storage=f"sqlite:///{project / 'csweep_runs/optuna.db'}")


def score(study: object, n: int, planted: tuple[str, str] | None) -> tuple[list[int], list[int]]:
    """([right, inconclusive, wrong] over all pairs, [coupled, inconclusive, no sign] of the planted pair)."""
    from reports import converged, coupling_analysis, trials_frame, usable
    from reports import categorical_params, numeric_params

    ok = converged(usable(trials_frame(study)))
    ok = ok[ok["trial"] < n]
    out = coupling_analysis(ok, numeric_params(study), categorical=categorical_params(study), seed=n)
    tally, mine = [0, 0, 0], [0, 0, 0]
    for c in out:
        truth = planted is not None and {c.param_a, c.param_b} == set(planted)
        v = c.verdict()
        if v.startswith("inconclusive"):
            tally[1] += 1
        elif v.startswith("coupled") == truth:
            tally[0] += 1
        else:
            tally[2] += 1
        if truth:
            mine[0 if v.startswith("coupled") else 1 if v.startswith("inconclusive") else 2] += 1
    return tally, mine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--studies", type=int, default=5)
    ap.add_argument("--sizes", default="12,20,30")
    ap.add_argument("--samplers", default="random,qmc,tpe,coupling")
    ap.add_argument("--objectives", default=",".join(OBJECTIVES))
    a = ap.parse_args()
    import warnings

    warnings.filterwarnings("ignore")
    sizes = [int(v) for v in a.sizes.split(",")]
    project = Path(tempfile.mkdtemp(prefix="csweep-verdicts-"))
    (project / "verdictobj.py").write_text(PLUGIN)
    sys.path.insert(0, str(project))
    for name in a.objectives.split(","):
        (project / f"{name}.yaml").write_text(space_yaml(name))
    print(f"{a.studies} seeded studies per cell; all pairs: right-decisive/inconclusive/wrong; "
          "planted pair: coupled/inconclusive/no sign", flush=True)
    print(f"{'objective':<15} {'sampler':<13} " + " ".join(f"{f'n={n}':>26}" for n in sizes), flush=True)
    t0 = time.time()
    for name in a.objectives.split(","):
        planted = OBJECTIVES[name][2]
        for sampler in a.samplers.split(","):
            cells = {n: ([0, 0, 0], [0, 0, 0]) for n in sizes}
            for seed in range(a.studies):
                study = run_study(project, name, sampler, seed, max(sizes))
                for n in sizes:
                    tally, mine = score(study, plan_trials(n) if sampler == "coupling-plan" else n, planted)
                    for acc, got in zip(cells[n], (tally, mine)):
                        for i in range(3):
                            acc[i] += got[i]
            row = []
            for n in sizes:
                tally, mine = cells[n]
                row.append(f"{'/'.join(map(str, tally))} ({'/'.join(map(str, mine)) if planted else '-'})")
            print(f"{name:<15} {sampler:<13} " + " ".join(f"{c:>26}" for c in row), flush=True)
    print(f"{time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
