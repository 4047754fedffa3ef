"""--early-stop dominated against running every trial to its end: the same sampler and seed, side
by side, through `csweep run` itself.

Two objectives:
- `curves`: the synthetic curve plug-in of tests/synthetic.py (known truth: loss falls to a floor
  set by lr and rank, a high lr overfits, memory grows with rank), 90 steps validated every 10,
  2 ms a step; a third arm runs every trial to its end under other seed noise, which says how
  much the front's hypervolume moves with the noise alone.
- `tiny`: the built-in objective on the tiny model, LoRA rank (memory) x lr x init_std, 80 steps,
  40 trials; with `val_every` at its default (every 18th step, and under `--early-stop
  dominated` also at each rung's step) and with `val_every: 10`.

Per study: trial-steps trained, wall time of the sweep, and the final front's hypervolume, every
front of a study measured against one reference point (csweep's rule on the study without early
stops: its usable trials' worst value plus 10% of their range). Also validation's share of trial time on
the built-in objective (its `val_seconds` over `train_seconds`).

    python benchmarks/early_stop.py                     # both; the figures in RESULTS.md
    python benchmarks/early_stop.py --only curves --studies 5 --trials 40
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
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

TINY_SPACE = """name: tiny
params:
  lora_rank: {type: int, low: 0, high: 8, step: 2}
  lr: {type: float, low: 1.0e-3, high: 1.0e-1, log: true}
  init_std: {type: float, low: 1.0e-3, high: 1.0, log: true}
fixed:
  steps: 80
"""


def run(project: Path, space: str, study: str, trials: int, seed: int, *extra: str) -> tuple[object, float]:
    import optuna

    from sweeps import main

    here = os.getcwd()
    os.chdir(project)
    err = io.StringIO()
    started = time.perf_counter()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            rc = main(["run", space, "--study", study, "--trials", str(trials), "--workers", "2",
                       "--sampler", "random", "--seed", str(seed), "--no-progress", "--no-samples"
                       if space.startswith("tiny") else "--no-progress", *extra])
    finally:
        os.chdir(here)
    assert rc == 0, (study, rc, err.getvalue()[-800:])
    wall = time.perf_counter() - started
    return optuna.load_study(study_name=study, storage=f"sqlite:///{project / 'csweep_runs/optuna.db'}"), wall


def points(study: object):
    """(the usable trials' (val_loss, peak_mem_mb), those of its front)."""
    from reports import trials_frame, usable
    from reports import pareto_mask

    pts = usable(trials_frame(study))[["val_loss", "peak_mem_mb"]].to_numpy(float)
    return pts, pts[pareto_mask(pts)]


def steps_trained(study: object) -> int:
    return int(sum(t.user_attrs.get("steps_run", 0) for t in study.trials))


def compare(project: Path, space: str, name: str, trials: int, seed: int, arms: dict[str, tuple[str, ...]]) -> dict:
    from reports import hypervolume, reference_point

    out = {}
    for arm, extra in arms.items():
        study, wall = run(project, space, f"{name}-{arm}-{seed}", trials, seed, *extra)
        usable, front = points(study)
        out[arm] = {"study": study, "wall": wall, "steps": steps_trained(study), "front": front, "usable": usable}
    ref = reference_point(out["full"]["usable"])
    for arm in out.values():
        arm["hv"] = hypervolume(arm["front"], ref) if len(arm["front"]) else 0.0
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=("curves", "tiny"))
    ap.add_argument("--studies", type=int, default=5)
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--tiny-trials", type=int, default=40)
    a = ap.parse_args()
    import warnings

    warnings.filterwarnings("ignore")
    from synthetic import CURVE_PLUGIN, CURVE_SPACE

    project = Path(tempfile.mkdtemp(prefix="csweep-early-stop-"))
    (project / "curves.py").write_text(CURVE_PLUGIN)
    (project / "curves.yaml").write_text(CURVE_SPACE + "  step_seconds: 0.002\n  salt: 0\n")
    (project / "tiny.yaml").write_text(TINY_SPACE)
    sys.path.insert(0, str(project))
    es = ("--early-stop", "dominated")
    if a.only in (None, "curves"):
        print(f"curves: {a.studies} studies of {a.trials} random trials, 2 workers", flush=True)
        print(f"{'seed':>4} {'steps full':>10} {'steps ES':>9} {'ratio':>6} {'wall full':>9} {'wall ES':>8} "
              f"{'HV full':>8} {'HV ES':>8} {'HV ES/full':>10} {'HV noise/full':>13}", flush=True)
        ratios, hvs, noise = [], [], []
        for seed in range(a.studies):
            r = compare(project, "curves.yaml", "curves", a.trials, seed,
                        {"full": (), "es": es, "noise": ("--set", "salt=1")})
            f, e, n = r["full"], r["es"], r["noise"]
            ratios.append(e["steps"] / f["steps"])
            hvs.append(e["hv"] / f["hv"])
            noise.append(n["hv"] / f["hv"])
            print(f"{seed:>4} {f['steps']:>10} {e['steps']:>9} {ratios[-1]:>6.2f} {f['wall']:>8.1f}s {e['wall']:>7.1f}s "
                  f"{f['hv']:>8.4f} {e['hv']:>8.4f} {hvs[-1]:>10.3f} {noise[-1]:>13.3f}", flush=True)
        mean = lambda v: sum(v) / len(v)  # noqa: E731
        print(f"curves: trial-steps ES/full {mean(ratios):.2f} (range {min(ratios):.2f}-{max(ratios):.2f}); "
              f"hypervolume ES/full {mean(hvs):.3f} (range {min(hvs):.3f}-{max(hvs):.3f}); the same study under "
              f"other seed noise: {mean(noise):.3f} (range {min(noise):.3f}-{max(noise):.3f})", flush=True)
    if a.only in (None, "tiny"):
        import torch

        torch.set_num_threads(1)
        print(f"tiny: {a.tiny_trials} random trials of the built-in objective, 2 workers", flush=True)
        for label, extra in (("val_every auto", ()), ("val_every 10", ("--set", "val_every=10"))):
            r = compare(project, "tiny.yaml", f"tiny{len(extra)}", a.tiny_trials, 0,
                        {"full": extra, "es": (*extra, *es)})
            f, e = r["full"], r["es"]
            pruned = sum(bool(t.user_attrs.get("rung")) for t in e["study"].trials)
            print(f"tiny, {label}: trial-steps {e['steps']} against {f['steps']} ({e['steps'] / f['steps']:.2f}), "
                  f"{pruned} stopped at a rung; wall {e['wall']:.0f} s against {f['wall']:.0f} s "
                  f"({e['wall'] / f['wall']:.2f}); hypervolume {e['hv']:.4g} against {f['hv']:.4g} "
                  f"({e['hv'] / f['hv']:.3f})", flush=True)
        from objectives import train

        # validation's cost: the same trial with validations during training and with none
        # (val_every = steps: step 0 and the last, which every trial had before)
        timed = {}
        for ve in (None, 10, 80):
            runs = [train({"steps": 80, "val_every": ve}).result for _ in range(3)]
            timed[ve] = sorted(runs, key=lambda x: x["train_seconds"])[1]
        base = timed[80]
        for ve in (None, 10):
            res = timed[ve]
            spent = res["val_seconds"] - base["val_seconds"]  # inside the validations during training
            n = int(res["val_points"]) - 2
            print(f"validation during training, default trial (80 steps), val_every {res['val_every']:.0f} "
                  f"({n} validations besides step 0 and the last): {spent:.2f} s of {res['train_seconds']:.2f} s "
                  f"({spent / res['train_seconds']:.0%}; {spent / max(n, 1):.3f} s each; whole trial "
                  f"{res['train_seconds'] / base['train_seconds'] - 1:+.0%} against none, within the machine's "
                  f"noise; median of 3)", flush=True)


if __name__ == "__main__":
    main()
