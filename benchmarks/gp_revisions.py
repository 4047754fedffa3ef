"""The surrogate (common/gp.py) of two revisions side by side: seconds per fit and whether the fits
are the same to the bit.

Both revisions' surrogates are loaded into this process (the old one from git) and fit the same
studies alternately, ROUNDS times each, so that the machine's load falls on both alike: a smooth
four-knob function with one interaction and noise at 20, 30, 60 and 120 trials, a categorical
knob beside two numeric ones, and validation-curve rows (an offset per trial). Prints each case's
median seconds per fit (the hyperparameter chains, then the component draws), the ratio, and
whether every hyperparameter draw and every component draw is identical.

    python benchmarks/gp_revisions.py [OLD] [--rounds 3]   (OLD: a git revision, default HEAD)
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def load_revision(rev: str, where: Path):
    """common/gp.py of git revision `rev`, with the modules of common/ it imports relatively, as a
    package of its own (`gp_rev`) under `where`."""
    package = where / "gp_rev"
    package.mkdir()
    (package / "__init__.py").write_text("")
    names = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", rev, "common/"], check=True,
                           capture_output=True, text=True).stdout.split()
    for name in names:
        if name.endswith(".py") and not name.endswith("__init__.py"):
            (package / Path(name).name).write_text(subprocess.run(
                ["git", "-C", str(ROOT), "show", f"{rev}:{name}"], check=True, capture_output=True, text=True).stdout)
    sys.path.insert(0, str(where))
    return importlib.import_module("gp_rev.gp")


def cases():
    rng = np.random.default_rng(5)
    for n, k, categorical, curves in [(20, 4, False, False), (30, 4, False, False), (60, 4, False, False),
                                      (120, 4, False, False), (30, 3, True, False), (60, 3, False, True)]:
        x = rng.random((n, k))
        groups, cat = [[i] for i in range(k)], [False] * k
        if categorical:  # the last knob: three levels, one-hot
            levels = rng.integers(0, 3, n)
            x = np.concatenate([x[:, :k - 1], np.eye(3)[levels]], axis=1)
            groups, cat = [[i] for i in range(k - 1)] + [[k - 1, k, k + 1]], [False] * (k - 1) + [True]
        y = np.sin(3 * x[:, 0]) + 2 * x[:, 0] * x[:, 1] + 0.1 * rng.normal(size=n)
        name = f"{n} trials, {k} knobs" + (", one categorical" if categorical else "") + \
            (", curve rows" if curves else "")
        yield name, dict(x=x, y=y, groups=groups, categorical=cat, cluster=np.arange(n) // 3 if curves else None)


def fit(gp, case) -> tuple[float, np.ndarray, list[np.ndarray]]:
    started = time.perf_counter()
    model = gp.BayesGP(case["x"], case["y"], case["groups"], categorical=case["categorical"],
                       cluster=case["cluster"], seed=3)
    draws = model.draws(per_hyper=2)
    seconds = time.perf_counter() - started
    hypers = np.array([np.concatenate([h.ls, h.main, h.pair, [h.noise, h.const, h.cluster]]) for h in model.hypers])
    return seconds, hypers, [draws[c] for c in sorted(draws)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old", nargs="?", default="HEAD")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sys.path.insert(0, str(ROOT))
        import common.gp

        revisions = {a.old: load_revision(a.old, Path(tmp)), "working tree": common.gp}
        print(f"{'case':<40} {a.old:>10} {'working tree':>13}  ratio  identical")
        for name, case in cases():
            times: dict[str, list[float]] = {r: [] for r in revisions}
            outputs: dict[str, tuple] = {}
            for _ in range(a.rounds):
                for rev, gp in revisions.items():
                    seconds, hypers, draws = fit(gp, case)
                    times[rev].append(seconds)
                    outputs[rev] = (hypers, draws)
            (h0, d0), (h1, d1) = outputs.values()
            same = np.array_equal(h0, h1) and all(np.array_equal(u, v) for u, v in zip(d0, d1))
            old, new = (statistics.median(t) for t in times.values())
            print(f"{name:<40} {old:>9.3f}s {new:>12.3f}s  {old / new:5.2f}  {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
