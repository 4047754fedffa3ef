"""Property-based, end to end: every valid space runs through `csweep run` and `csweep report` to a
whole report; every invalid one is one line, exit 2, nothing written.

Random spaces (hypothesis): float / int / log / step / categorical knobs (strings, numbers,
booleans), 1 to 6 of them, with and without hypotheses (a categorical param in a pair, a power
law between numeric ones), 1 or 2 seeds, two or three objectives, trials that run out of memory
or fail mixed in, on a fast plug-in objective, run by `sweeps.main` in the test process. The CI
profile is derandomized (the same examples every run); HYPOTHESIS_PROFILE=explore draws new
ones, more of them.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

settings.register_profile("ci", max_examples=10, deadline=None, derandomize=True,
                          suppress_health_check=list(HealthCheck))
settings.register_profile("explore", max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
INVALID_EXAMPLES = 40 if PROFILE == "ci" else 200

PLUGIN = '''
import hashlib
import math


class OutOfMemoryError(RuntimeError):
    """Named as torch's is: csweep reads an out-of-memory by the exception's class name."""


def _num(v):
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v)
    return int(hashlib.sha1(str(v).encode()).hexdigest()[:6], 16) / 0xFFFFFF


def objective(params):
    names = sorted(params["knobs"])
    key = hashlib.sha1(repr([(n, params[n]) for n in names]).encode()).digest()
    if key[0] % 11 == 0:
        raise OutOfMemoryError("planted: CUDA out of memory. Tried to allocate 2.00 GiB")
    if key[0] % 11 == 1:
        raise RuntimeError("planted failure")
    xs = [math.tanh(_num(params[n])) for n in names]
    val = sum((x - 0.3) ** 2 for x in xs) + (xs[0] * xs[-1] if len(xs) > 1 else 0.0)
    val += 0.01 * ((params.get("seed", 0) * 7919) % 101) / 100
    return {"val_loss": val, "peak_mem_mb": 10.0 + 5 * abs(xs[-1]) + key[1] / 64,
            "fidelity": 1.0 / (1.0 + val)}
'''

REPORT_FILES = ("trials.csv", "trials.md", "trials.html", "trials.tex", "pareto.csv", "pareto.md",
                "pareto.html", "pareto.tex", "pareto.png", "pareto_front.html", "summary.json",
                "coupling.csv", "scaling.csv", "index.html")


# --- the spaces ----------------------------------------------------------------------------
@st.composite
def numeric_param(draw):
    kind = draw(st.sampled_from(["float", "int"]))
    log = draw(st.booleans())
    if kind == "int":
        low = draw(st.integers(1 if log else -5, 20))
        high = low + draw(st.integers(1, 40))
        spec = {"type": "int", "low": low, "high": high}
        if not log and draw(st.booleans()):
            spec["step"] = draw(st.integers(1, max(1, (high - low))))
            spec["high"] = low + spec["step"] * max(1, (high - low) // spec["step"])
    else:
        low = draw(st.sampled_from([1e-5, 1e-3, 0.1, 1.0]) if log else st.sampled_from([-1.0, 0.0, 0.5, 2.0]))
        high = low * draw(st.sampled_from([3.0, 100.0, 1e4])) if log else low + draw(st.sampled_from([0.5, 1.0, 10.0]))
        spec = {"type": "float", "low": low, "high": high}
        if not log and draw(st.booleans()):
            spec["step"] = (high - low) / draw(st.integers(2, 10))
    if log:
        spec["log"] = True
    return spec


CHOICES = st.one_of(
    st.lists(st.sampled_from(["a", "b", "embedding_only", "attention only", "x-1", "ü"]), min_size=2, max_size=4,
             unique=True),
    st.lists(st.sampled_from([1, 2, 4, 8, 0.5, -3]), min_size=2, max_size=4, unique=True),
    st.just([True, False]),
    st.just(["none", 2, True]),
)


@st.composite
def valid_space(draw):
    n = draw(st.integers(1, 6))
    params = {}
    for i in range(n):
        params[f"k{i}"] = (draw(numeric_param()) if draw(st.booleans())
                           else {"type": "categorical", "choices": draw(CHOICES)})
    hypotheses = []
    if n >= 2 and draw(st.booleans()):
        names = list(params)
        for _ in range(draw(st.integers(1, 2))):
            x, y = draw(st.permutations(names))[:2]
            numeric = all(params[p]["type"] != "categorical" for p in (x, y))
            h = {"x": x, "y": y}
            if numeric and draw(st.booleans()):
                h["law"] = "power"
            hypotheses.append(h)
    space = {"name": "prop", "objective": "propobj:objective", "params": params,
             "fixed": {"knobs": list(params)}}
    if hypotheses:
        space["hypotheses"] = hypotheses
    return space


BREAKS = [
    # (how a valid space is broken, words the one line must hold)
    (lambda s: s["params"].__setitem__("k0", {"type": "uniform", "low": 0, "high": 1}), "params.k0.type"),
    (lambda s: s["params"].__setitem__("k0", {"type": "float", "low": 2.0, "high": 1.0}), "params.k0.low"),
    (lambda s: s["params"].__setitem__("k0", {"type": "float", "low": 0.0, "high": 1.0, "log": True}),
     "params.k0.low"),
    (lambda s: s["params"].__setitem__("k0", {"type": "int", "low": 1, "high": 9, "step": 0.5}), "params.k0.step"),
    (lambda s: s["params"].__setitem__("k0", {"type": "float", "low": 1.0, "high": 9.0, "log": True, "step": 1.0}),
     "params.k0.step"),
    (lambda s: s["params"].__setitem__("k0", {"type": "categorical", "choices": []}), "params.k0.choices"),
    (lambda s: s["params"].__setitem__("k0", {"type": "categorical", "choices": ["a", "a"]}), "params.k0.choices"),
    (lambda s: s["params"].__setitem__("k0", {"type": "float", "low": 0, "high": 1, "logg": True}), "params.k0.logg"),
    (lambda s: s.__setitem__("hypotheses", [{"x": "k0", "y": "nope"}]), "hypotheses[0].y"),
    (lambda s: s.__setitem__("hypotheses", [{"x": "k0", "y": "k0"}]), "hypotheses[0]"),
    (lambda s: s.__setitem__("hypotheses", [{"x": "k0", "y": "knobs"}]), "hypotheses[0].y"),
    (lambda s: s.__setitem__("hypotheses", [{"x": "k0", "law": "power"}]), "hypotheses[0]"),
    (lambda s: s.__setitem__("hypotheses", [{"x": "k0", "y": "k1", "law": "cubic"}]), "hypotheses[0]"),
    (lambda s: s.__setitem__("paramz", {}), "paramz"),
    (lambda s: s.__setitem__("params", []), "params"),
    (lambda s: s["fixed"].__setitem__("k0", 1), "k0"),
]


# --- running csweep as a user does, in this process -----------------------------------------
class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)

    def handle_data(self, data):
        self.text.append(data)


def _csweep(cwd: Path, *args: str) -> tuple[int, str, str]:
    from sweeps import main

    out, err = io.StringIO(), io.StringIO()
    here = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(list(args))
    finally:
        os.chdir(here)
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory, request):
    import sys

    d = tmp_path_factory.mktemp("anyspace")
    (d / "propobj.py").write_text(PLUGIN)
    sys.path.insert(0, str(d))
    request.addfinalizer(lambda: sys.path.remove(str(d)))
    return d


@pytest.mark.slow
@settings(settings.get_profile(PROFILE))
@given(space=valid_space(), seeds=st.sampled_from([1, 2]), three=st.booleans(), trials=st.integers(6, 12))
def test_every_valid_space_runs_to_a_whole_report(plugin_dir, space, seeds, three, trials):
    project = Path(tempfile.mkdtemp(dir=plugin_dir))
    (project / "prop.yaml").write_text(yaml.safe_dump(space, allow_unicode=True))
    objectives = "val_loss,peak_mem_mb,fidelity" if three else "val_loss,peak_mem_mb"
    rc, out, err = _csweep(project, "run", "prop.yaml", "--trials", str(trials), "--workers", "2",
                           "--seeds", str(seeds), "--sampler", "random", "--seed", "3",
                           "--objectives", objectives, "--no-progress")
    assert rc == 0, (space, err[-2000:])
    assert "Traceback" not in err, err[-2000:]
    report = project / "csweep_runs/reports/prop"
    first = {f: (report / f).read_bytes() for f in ("trials.csv", "summary.json")}
    rc, _, err = _csweep(project, "report", "prop")
    assert rc == 0 and "Traceback" not in err, (space, err[-2000:])
    for name in REPORT_FILES:
        assert (report / name).is_file() and (report / name).stat().st_size > 0, (name, space)
    assert (report / "trials.csv").read_bytes() == first["trials.csv"]
    summary = json.loads((report / "summary.json").read_text())
    assert summary["n_trials"] == trials and summary["objectives"] == objectives.split(",")
    # every hypothesis and every drawn pair has its picture unless a note says why not
    notes = [line for line in err.splitlines() if "left out" in line]
    for h in space.get("hypotheses", []):
        drawn = (report / f"pair_{h['x']}__{h['y']}.png").is_file()
        assert drawn or any(f"pair_{h['x']}__{h['y']}" in n for n in notes), (h, notes)
    page = _Page()
    page.feed((report / "index.html").read_text())
    page.close()
    assert {"html", "body", "h1", "table"} <= set(page.tags)
    assert "Pareto front" in "".join(page.text)


@settings(max_examples=INVALID_EXAMPLES, deadline=None, derandomize=PROFILE == "ci",
          suppress_health_check=list(HealthCheck))
@given(space=valid_space().filter(lambda s: len(s["params"]) >= 2), broken=st.sampled_from(range(len(BREAKS))))
def test_every_invalid_space_is_one_line_exit_2_nothing_written(plugin_dir, space, broken):
    project = Path(tempfile.mkdtemp(dir=plugin_dir))
    breaks, words = BREAKS[broken]
    breaks(space)
    (project / "prop.yaml").write_text(yaml.safe_dump(space, allow_unicode=True))
    rc, out, err = _csweep(project, "run", "prop.yaml", "--trials", "4", "--no-progress")
    assert rc == 2, (space, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("csweep: error:") and words in lines[0], (space, err)
    assert "prop.yaml" in lines[0]
    assert sorted(p.name for p in project.iterdir()) == ["prop.yaml"]
