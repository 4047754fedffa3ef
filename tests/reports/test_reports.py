"""Reports: Pareto/hypervolume against brute force, coupling and laws on planted truths, the page."""

from __future__ import annotations

import json
import math
import shutil
import subprocess

import numpy as np
import optuna
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState, create_trial

from reports import coupling_analysis, fit_power_law, hypervolume, pareto_mask, reference_point, write_study_report

points_2d = st.lists(
    st.tuples(st.integers(0, 20), st.integers(0, 20)).map(lambda p: (float(p[0]), float(p[1]))),
    min_size=1, max_size=25,
)


def brute_front(pts: list[tuple[float, float]]) -> set[int]:
    return {i for i, a in enumerate(pts)
            if not any(b[0] <= a[0] and b[1] <= a[1] and b != a for b in pts)}


def brute_hypervolume(pts: list[tuple[float, float]], ref: tuple[float, float]) -> float:
    """Union of the boxes [p, ref], on the grid of all coordinates."""
    xs = sorted({p[0] for p in pts} | {ref[0]})
    ys = sorted({p[1] for p in pts} | {ref[1]})
    area = 0.0
    for x0, x1 in zip(xs, xs[1:]):
        for y0, y1 in zip(ys, ys[1:]):
            if any(p[0] <= x0 and p[1] <= y0 for p in pts):
                area += (x1 - x0) * (y1 - y0)
    return area


@settings(max_examples=150, deadline=None)
@given(points_2d)
def test_pareto_set_equals_brute_force(pts):
    mask = pareto_mask(np.array(pts))
    assert {i for i, m in enumerate(mask) if m} == brute_front(pts)


@settings(max_examples=150, deadline=None)
@given(points_2d, st.integers(21, 30), st.integers(21, 30))
def test_hypervolume_equals_brute_force(pts, rx, ry):
    ref = (float(rx), float(ry))
    assert hypervolume(np.array(pts), ref) == pytest.approx(brute_hypervolume(pts, ref))


def test_reference_point_is_worst_plus_tenth_of_range():
    pts = np.array([[1.0, 10.0], [3.0, 30.0], [2.0, 20.0]])
    assert reference_point(pts) == pytest.approx([3.2, 32.0])
    assert reference_point(np.array([[2.0, 5.0]])) == pytest.approx([2.2, 5.5])


def _frame(x: np.ndarray, y: np.ndarray, names: list[str]) -> pd.DataFrame:
    df = pd.DataFrame(x, columns=names)
    df.insert(0, "trial", range(len(df)))
    df.insert(1, "state", "COMPLETE")
    df.insert(2, "val_loss", y)
    df.insert(3, "peak_mem_mb", 1.0)
    return df


def test_coupling_ranks_the_planted_interaction_first_and_additive_pairs_near_zero():
    rng = np.random.default_rng(1)
    n = 50
    x = rng.uniform(0, 1, (n, 4))
    y = 4 * (x[:, 0] - 0.5) * (x[:, 1] - 0.5) + x[:, 2] + 2 * (x[:, 3] - 0.5) ** 2 + rng.normal(0, 0.02, n)
    names = ["warm", "sigma", "lr", "decay"]
    out = coupling_analysis(_frame(x, y, names), {k: {"low": 0, "high": 1} for k in names}, n_boot=10)
    assert (out[0].param_a, out[0].param_b) == ("warm", "sigma")
    assert out[0].ci_low > 0.1
    additive = [c for c in out if {c.param_a, c.param_b} == {"lr", "decay"}][0]
    assert additive.strength < 0.02
    assert "coupled" in out[0].sentence() and "tuned one at a time" in additive.sentence()


@pytest.mark.slow
def test_planted_power_law_is_recovered_within_its_interval():
    rng = np.random.default_rng(2)
    n = 240
    lx, ly = rng.uniform(0, math.log(100), n), rng.uniform(math.log(1e-2), math.log(1e3), n)
    val = (ly - math.log(2.0) - 0.5 * lx) ** 2 + rng.normal(0, 0.01, n)
    fit = fit_power_law(_frame(np.exp(np.stack([lx, ly], 1)), val, ["W", "sigma"]), "W", "sigma")
    assert fit.alpha_ci_low <= 0.5 <= fit.alpha_ci_high
    assert abs(fit.alpha - 0.5) < 0.2
    assert fit.excludes(-0.5) and not fit.excludes(0.5)
    assert "alpha = -0.5 is excluded" in fit.sentence()
    assert "alpha = +0.5 is not excluded" in fit.sentence()


@pytest.fixture(scope="module")
def messy_study(tmp_path_factory):
    """A plug-in study with arbitrary param names, failed, pruned, infeasible and running trials."""
    storage = f"sqlite:///{tmp_path_factory.mktemp('st') / 'o.db'}"
    study = optuna.create_study(study_name="messy", storage=storage, directions=["minimize", "minimize"])
    study.set_user_attr("max_mem_mb", 150.0)
    study.set_user_attr("space", {"hypotheses": [{"x": "width", "y": "noise", "law": "power"}]})
    dists = {"width": FloatDistribution(1, 100, log=True), "noise": FloatDistribution(1e-3, 10, log=True),
             "mode": CategoricalDistribution(["a", "b"])}
    rng = np.random.default_rng(3)
    for i in range(60):
        p = {"width": float(np.exp(rng.uniform(0, math.log(100)))),
             "noise": float(np.exp(rng.uniform(math.log(1e-3), math.log(10)))), "mode": ["a", "b"][i % 2]}
        loss = (math.log(p["noise"]) - 0.5 * math.log(p["width"])) ** 2 + 0.1 * (p["mode"] == "b")
        mem = 10 * p["width"] ** 0.5 + 5 * (p["mode"] == "b")
        if i % 13 == 5:
            study.add_trial(create_trial(state=TrialState.FAIL, params=p, distributions=dists,
                                         user_attrs={"fail_reason": "RuntimeError: boom"}))
        elif i % 17 == 7:
            study.add_trial(create_trial(state=TrialState.PRUNED, params=p, distributions=dists))
        else:
            study.add_trial(create_trial(values=[loss, mem], params=p, distributions=dists,
                                         user_attrs={"mlflow_run_id": f"run{i}"}))
    study.add_trial(create_trial(state=TrialState.RUNNING, params=p, distributions=dists))
    return study


def test_report_of_a_messy_running_study(messy_study, tmp_path):
    files = write_study_report(messy_study, tmp_path / "out", n_boot=5)
    for name in ("trials.csv", "pareto.csv", "pareto.md", "pareto.html", "pareto.tex", "pareto.png",
                 "index.html", "summary.json", "coupling.csv", "scaling.csv", "pareto_front.html"):
        assert name in files and files[name].stat().st_size > 0, name
    trials = pd.read_csv(files["trials.csv"])
    front = pd.read_csv(files["pareto.csv"])
    assert set(trials["state"]) == {"COMPLETE", "FAIL", "PRUNED", "RUNNING"}
    assert "feasible" in front.columns and front["feasible"].all()
    ok = trials[(trials["state"] == "COMPLETE") & trials["feasible"]]
    pts = list(zip(ok["val_loss"], ok["peak_mem_mb"]))
    expect = {int(ok.iloc[i]["trial"]) for i in brute_front(pts)}
    assert set(front["trial"]) == expect
    assert list(front["peak_mem_mb"]) == sorted(front["peak_mem_mb"])
    summary = json.loads(files["summary.json"].read_text())
    assert summary["counts_by_state"]["FAIL"] > 0 and summary["counts_by_state"]["RUNNING"] == 1
    ref = summary["reference_point"]
    assert summary["hypervolume"] == pytest.approx(hypervolume(np.array(pts), ref))
    coupling = pd.read_csv(files["coupling.csv"])
    assert list(coupling.columns[:5]) == ["param_a", "param_b", "strength", "ci_low", "ci_high"]
    assert set(coupling.iloc[0][["param_a", "param_b"]]) == {"width", "noise"}
    scaling = pd.read_csv(files["scaling.csv"])
    assert list(scaling.columns[:8]) == ["x", "y", "law", "alpha", "alpha_ci_low", "alpha_ci_high", "c", "r2"]
    assert scaling.iloc[0]["alpha_ci_low"] <= 0.5 <= scaling.iloc[0]["alpha_ci_high"]
    assert "\\begin{tabular}" in files["pareto.tex"].read_text()
    page = files["index.html"].read_text()
    import re

    # offline: no script, stylesheet or image is fetched from anywhere
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=[\"']?(https?:)?//", page)
    assert page.count("<script") >= 1 and "data:image/png;base64," in page


@pytest.mark.slow
def test_index_html_renders_in_headless_chromium(messy_study, tmp_path):
    from PIL import Image

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    assert browser, "Debian's chromium is installed by .ci/run (apt-get install chromium)"
    files = write_study_report(messy_study, tmp_path / "out", n_boot=5)
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,1600"]
    url = files["index.html"].as_uri()
    shot = tmp_path / "page.png"
    subprocess.run([browser, *flags, f"--screenshot={shot}", url], capture_output=True, timeout=120, check=True)
    img = np.asarray(Image.open(shot).convert("L"), dtype=float)
    assert img.std() > 10, "the page rendered blank"
    dom = subprocess.run([browser, *flags, "--dump-dom", url], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    assert "Pareto front" in dom and "csweep-table" in dom
    front = pd.read_csv(files["pareto.csv"])
    assert f"run{int(front.iloc[0]['trial'])}" in dom  # table text present in the rendered DOM
    assert "plotly-graph-div" in dom and "main-svg" in dom  # the interactive front was drawn


def test_report_command_overlays_several_studies(messy_study, tmp_path, capsys):
    from sweeps import main

    storage = str(messy_study._storage._backend.engine.url)
    other = optuna.create_study(study_name="other", storage=storage, directions=["minimize", "minimize"])
    for i in range(5):
        other.add_trial(create_trial(values=[1.0 / (i + 1), 10.0 * i], params={"w": float(i)},
                                     distributions={"w": FloatDistribution(0, 10)}))
    rc = main(["report", "messy", "other", "--storage", storage, "--workdir", str(tmp_path)])
    assert rc == 0
    out = tmp_path / "reports/compare-messy-vs-other"
    table = pd.read_csv(out / "pareto.csv")
    assert set(table["study"]) == {"messy", "other"}
    assert (out / "pareto.png").stat().st_size > 0 and (out / "pareto_front.html").is_file()
    assert (tmp_path / "reports/other/index.html").is_file()
    captured = capsys.readouterr()
    assert "comparison:" in captured.out and "different data" not in captured.err
    # studies whose trials saw different data are never compared unknowingly
    messy_study.set_user_attr("data_digest", "aaaa-bbbb")
    other.set_user_attr("data_digest", "cccc-dddd")
    assert main(["report", "messy", "other", "--storage", storage, "--workdir", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "different data" in err and "messy: aaaa-bbbb" in err and "other: cccc-dddd" in err
    assert "different data" in (out / "pareto.md").read_text()
    assert json.loads((tmp_path / "reports/other/summary.json").read_text())["data_digest"] == "cccc-dddd"
    messy_study.set_user_attr("data_digest", None)


def _grid_png(color: tuple[int, int, int]) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 4), color).save(buf, format="PNG")
    return buf.getvalue()


def test_gallery_shows_front_and_worst_trial_grids_offline(messy_study, tmp_path):
    """Every trial drew grids (kept as WORKDIR/samples/STUDY/N/CONCEPT.png); the page shows the
    front's and the worst complete trial's, each beside its numbers, and pareto_front.html shows
    a point's grid on hover or click."""
    samples = tmp_path / "samples"
    complete = [t for t in messy_study.trials if t.state == TrialState.COMPLETE]
    for t in complete:
        (samples / str(t.number)).mkdir(parents=True)
        (samples / str(t.number) / "cat.png").write_bytes(_grid_png((t.number, 0, 0)))
    files = write_study_report(messy_study, tmp_path / "out", n_boot=5, samples=samples)
    page = files["index.html"].read_text()
    front = pd.read_csv(files["pareto.csv"])
    trials = pd.read_csv(files["trials.csv"])
    usable = trials[(trials["state"] == "COMPLETE") & trials["feasible"]]
    worst = int(usable.loc[usable["val_loss"].idxmax(), "trial"])
    shown = {int(n) for n in __import__("re").findall(r"id='samples-(\d+)'", page)}
    assert shown == set(front["trial"]) | {worst}
    assert "worst complete trial" in page
    row = front.iloc[0]
    block = page[page.index(f"id='samples-{int(row['trial'])}'"):]
    block = block[: block.index("</div></div>")]
    assert f"val_loss {row['val_loss']:.4g}" in block and f"peak_mem_mb {row['peak_mem_mb']:.4g}" in block
    assert "width=" in block and "data:image/png;base64," in block
    hover = files["pareto_front.html"].read_text()
    assert "gd.on('plotly_hover', show)" in hover and "gd.on('plotly_click', show)" in hover
    assert all(f'"{int(t)}": {{"cat": "data:image/png;base64,' in hover for t in usable["trial"])
    # without grids, no gallery and no hover script
    plain = write_study_report(messy_study, tmp_path / "plain", n_boot=5)
    assert "id='samples-" not in plain["index.html"].read_text()
    assert "csweep-samples" not in plain["pareto_front.html"].read_text()


# --- three objectives: fidelity maximized beside val_loss and memory ------------------------
points_3d = st.lists(st.tuples(st.integers(0, 8), st.integers(0, 8), st.integers(0, 8)).map(
    lambda p: tuple(float(v) for v in p)), min_size=1, max_size=12)


def brute_front_3(pts: list[tuple[float, float, float]]) -> set[int]:
    """Non-dominated points when the first two are minimized and the third maximized."""
    def beats(b, a):
        return b[0] <= a[0] and b[1] <= a[1] and b[2] >= a[2] and b != a
    return {i for i, a in enumerate(pts) if not any(beats(b, a) for b in pts)}


def brute_hypervolume_3(pts, ref) -> float:
    """Volume dominated by the points (min, min, max) and bounded by ref, on the grid of all
    coordinates."""
    axes = [sorted({p[k] for p in pts} | {ref[k]}) for k in range(3)]
    vol = 0.0
    for x0, x1 in zip(axes[0], axes[0][1:]):
        for y0, y1 in zip(axes[1], axes[1][1:]):
            for z0, z1 in zip(axes[2], axes[2][1:]):
                if any(p[0] <= x0 and p[1] <= y0 and p[2] >= z1 for p in pts):
                    vol += (x1 - x0) * (y1 - y0) * (z1 - z0)
    return vol



def _three():
    from reports import Objectives

    return Objectives(("val_loss", "peak_mem_mb", "fidelity"), ("minimize", "minimize", "maximize"))


@settings(max_examples=100, deadline=None)
@given(points_3d)
def test_three_objective_front_and_hypervolume_equal_brute_force(pts):
    obj = _three()
    signed = obj.minimized(pd.DataFrame(pts, columns=list(obj.names)))
    assert {i for i, m in enumerate(pareto_mask(signed)) if m} == brute_front_3(pts)
    ref = (9.0, 9.0, -1.0)  # in the objectives' own units: fidelity's reference lies below its worst
    assert hypervolume(signed, list(np.array(ref) * obj.signs)) == pytest.approx(brute_hypervolume_3(pts, ref))


@pytest.fixture(scope="module")
def three_objective_study(tmp_path_factory):
    """val_loss, memory and fidelity; two seeds per config (their std on the trials). Trial 1 is
    beaten by trial 0 on val_loss and memory but draws the concept better: only the third
    objective puts it on the front."""
    storage = f"sqlite:///{tmp_path_factory.mktemp('st3') / 'o.db'}"
    study = optuna.create_study(study_name="three", storage=storage,
                                directions=["minimize", "minimize", "maximize"])
    study.set_metric_names(["val_loss", "peak_mem_mb", "fidelity"])
    dists = {"lr": FloatDistribution(1e-4, 1e-1, log=True), "rank": FloatDistribution(0, 8)}
    rng = np.random.default_rng(5)
    rows = [(0.10, 20.0, 0.30), (0.12, 21.0, 0.60)]
    rows += [(float(rng.uniform(0.1, 0.3)), float(rng.uniform(20, 30)), float(rng.uniform(0.0, 0.4)))
             for _ in range(14)]
    for i, (loss, mem, fid) in enumerate(rows):
        attrs = {"n_seeds": 2, "val_loss_std": 0.002, "val_loss_sem": 0.002 / math.sqrt(2), "fidelity": fid,
                 "fidelity_std": 0.01 + 0.01 * (i % 3), "fidelity_sem": (0.01 + 0.01 * (i % 3)) / math.sqrt(2)}
        study.add_trial(create_trial(values=[loss, mem, fid], params={"lr": 10 ** -(1 + i % 3), "rank": float(i % 8)},
                                     distributions=dists, user_attrs=attrs))
    study.add_trial(create_trial(state=TrialState.FAIL, params={"lr": 0.01, "rank": 1.0}, distributions=dists,
                                 user_attrs={"fail_reason": "the study's objective fidelity has no finite value"}))
    return study, rows


def test_report_of_a_three_objective_study(three_objective_study, tmp_path):
    study, rows = three_objective_study
    out = tmp_path / "out"
    files = write_study_report(study, out, n_boot=5)
    front = pd.read_csv(out / "pareto.csv")
    assert set(front["trial"]) == brute_front_3(rows)
    assert {0, 1} <= set(front["trial"])  # trial 1 only through fidelity
    assert front["p_front"].between(0, 1).all()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["objectives"] == ["val_loss", "peak_mem_mb", "fidelity"]
    assert summary["directions"] == {"val_loss": "minimize", "peak_mem_mb": "minimize", "fidelity": "maximize"}
    worst, best = np.max(rows, axis=0), np.min(rows, axis=0)
    span = worst - best
    assert summary["reference_point"] == pytest.approx([worst[0] + 0.1 * span[0], worst[1] + 0.1 * span[1],
                                                        best[2] - 0.1 * span[2]])
    assert summary["hypervolume"] == pytest.approx(brute_hypervolume_3(rows, summary["reference_point"]))
    # the seed noise of fidelity, pooled over the configs' replicates, against its spread
    stds = np.array([0.01 + 0.01 * (i % 3) for i in range(len(rows))])
    assert summary["fidelity_noise_floor_std"] == pytest.approx(math.sqrt((stds ** 2).mean()))
    assert summary["fidelity_spread_std"] == pytest.approx(np.std([r[2] for r in rows], ddof=1))
    page = (out / "index.html").read_text()
    assert "objectives: minimize val_loss, minimize peak_mem_mb, maximize fidelity" in page
    assert "Seed noise floor: fidelity std" in page
    trials = pd.read_csv(out / "trials.csv")
    assert trials.loc[trials["trial"] == 1, "fidelity"].item() == pytest.approx(0.6)
    assert {"fidelity_std", "fidelity_sem"} <= set(trials.columns)
    assert "maximize fidelity" in (out / "pareto.md").read_text()
    html = (out / "pareto_front.html").read_text()
    assert '"colorscale"' in html and "fidelity=0.6" in html
    from PIL import Image

    assert Image.open(files["pareto.png"]).size[0] > 1000  # the second panel: val_loss vs fidelity


def test_every_kind_of_pair_is_drawn_and_a_figure_that_fails_is_left_out_with_a_line(
        messy_study, tmp_path, monkeypatch, capsys):
    """The report of a space with a categorical knob in a declared pair: the pair gets a picture of
    its kind (a curve per level); a figure that raises costs only itself, with one line."""
    import reports._report as R

    before = messy_study.user_attrs["space"]
    space = {"hypotheses": [{"x": "mode", "y": "width"}, {"x": "width", "y": "noise", "law": "power"}]}
    messy_study.set_user_attr("space", space)
    try:
        def broken(*args, **kwargs):
            raise RuntimeError("planted: this figure cannot be drawn")

        monkeypatch.setattr(R, "law_png", broken)
        files = write_study_report(messy_study, tmp_path / "out", n_boot=5)
        assert files["pair_mode__width.png"].stat().st_size > 0
        assert "law_width__noise.png" not in files and not (tmp_path / "out/law_width__noise.png").exists()
        err = capsys.readouterr().err
        assert "law_width__noise.png left out: RuntimeError: planted: this figure cannot be drawn" in err
        page = files["index.html"].read_text()
        assert "law_width__noise.png left out" in page and "Conclusions" in page
        # the pairs the Conclusions tell to tune together, the two strongest open ones and the
        # declared ones have their pictures on the page
        import re

        import pandas as pd

        couplings = pd.read_csv(files["coupling.csv"])
        talked = [tuple(r) for r in couplings[couplings["verdict"] == "coupled"][["param_a", "param_b"]].values]
        talked += [tuple(r) for r in couplings[couplings["verdict"] == "inconclusive"][["param_a", "param_b"]].values][:2]
        talked += [("mode", "width"), ("width", "noise")]
        for a, b in talked:
            drawn = re.findall(r'alt="(val_loss over [^"]*|[^"]* stable region[^"]*)"', page)
            assert f'alt="val_loss over {a} × {b}"' in page or f'alt="val_loss over {b} × {a}"' in page, (a, b, drawn)
        for name in ("pareto.png", "summary.json", "coupling.csv", "trials.csv"):
            assert files[name].stat().st_size > 0
    finally:  # the study is module-wide
        messy_study.set_user_attr("space", before)


def test_a_page_without_verdicts_says_why_and_what_to_do(tmp_path):
    """Five trials ran to their end and twelve were stopped at a rung by --early-stop dominated:
    the page says how many trials the coupling analysis has and needs, and that the stopped ones
    are out of the fits; with nothing stopped it says how many more trials to run."""
    dists = {"lr": FloatDistribution(1e-3, 1e-1, log=True), "rank": FloatDistribution(1, 8)}
    rng = np.random.default_rng(0)

    def study_of(name: str, stopped: int) -> optuna.Study:
        study = optuna.create_study(study_name=name, storage=f"sqlite:///{tmp_path / name}.db",
                                    directions=["minimize", "minimize"])
        for i in range(5 + stopped):
            p = {"lr": float(10 ** rng.uniform(-3, -1)), "rank": float(rng.uniform(1, 8))}
            attrs = {"steps_planned": 90, "steps_run": 90, "val_curve": [[0, 1.5], [20, 1.2], [90, 1.0]]}
            if i < 5:
                study.add_trial(create_trial(values=[float(rng.normal(1, 0.1)), 10 * p["rank"]], params=p,
                                             distributions=dists, user_attrs=attrs))
            else:
                study.add_trial(create_trial(state=TrialState.PRUNED, params=p, distributions=dists,
                                             user_attrs={**attrs, "steps_run": 20, "rung": 2,
                                                         "val_curve": [[0, 1.5], [20, 1.4]],
                                                         "prune_reason": "dominated at rung 2 (step 20)"}))
        return study

    page = write_study_report(study_of("stopped", 12), tmp_path / "a", n_boot=5)["index.html"].read_text()
    assert "5 fitted, 8 needed" in page and "The 12 trials that --early-stop dominated stopped" in page
    assert "run trials to their end" in page and "about 3 more" not in page
    summary = json.loads(write_study_report(study_of("few", 0), tmp_path / "b", n_boot=5)["summary.json"].read_text())
    assert summary["no_verdict_reason"] == ("Not enough usable trials for a coupling verdict yet: 5 fitted, 8 needed: "
                                            "about 3 more trials.")


def test_tables_lead_with_what_a_reader_decides_on():
    """The page's tables: trial, p_front and the objectives first, ids and reasons last; a long
    reason is one line with the whole text on hover; rerun_of is a whole number (issue 45, item 4)."""
    import re

    import pandas as pd

    from reports._tables import html_table

    reason = "stopped at rung 2: trial 3 reached step 40 with less memory and a lower val_loss " * 2
    df = pd.DataFrame({"trial": [7], "state": ["PRUNED"], "val_loss": [0.1], "peak_mem_mb": [12.0],
                       "mlflow_run_id": ["a" * 32], "lr": [1e-3], "outcome": ["pruned"], "health": ["ok"],
                       "node_id": ["n" * 56], "rerun_of": [27.0], "reason": [reason], "p_front": [0.4]})
    page = html_table(df)
    header = re.findall(r"<th>(.*?)</th>", page)
    assert header[:5] == ["trial", "p_front", "val_loss", "peak_mem_mb", "health"]
    assert header[-3:] == ["reason", "mlflow_run_id", "node_id"]
    assert f'title="{reason}"' in page and f">{reason}<" not in page  # cut, whole on hover
    assert "<td>27</td>" in page and "27.0" not in page


def test_a_rerun_front_says_which_configs_held_under_fresh_seeds():
    """Issue 45, item 5: a lucky original does not dominate its own re-run; a re-run worse than
    another config's is 'did not hold'; the front now rests on the re-runs and the untouched."""
    import pandas as pd

    from reports import Objectives
    from reports._tables import rerun_outcomes, rerun_sentence

    rows = [  # trial, val_loss, peak_mem_mb, rerun_of
        (0, 0.0846, 10.0, None), (1, 0.0900, 5.0, None), (2, 0.0950, 12.0, None),
        (3, 0.0878, 10.0, 0.0),  # trial 0 again: worse than its lucky 0.0846, still the best at 10 MB
        (4, 0.0990, 5.0, 1.0),  # trial 1 again: worse, still the least memory
    ]
    df = pd.DataFrame([{"trial": t, "state": "COMPLETE", "val_loss": v, "peak_mem_mb": m, "outcome": "ok",
                        "health": "ok", "n_seeds": 3 if r is not None else 1, "rerun_of": r} for t, v, m, r in rows])
    out, rests_on = rerun_outcomes(df, Objectives(("val_loss", "peak_mem_mb"), ("minimize", "minimize")))
    by = {r["trial"]: r for r in out}
    assert by[0]["held"] and by[0]["rerun"] == 3 and by[1]["held"]
    assert rests_on == [3, 4]  # trial 2 (0.095 at 12 MB) is dominated by trial 3
    df.loc[df["trial"] == 4, "val_loss"] = 0.2  # and a cheaper config beside it beats it
    df.loc[len(df)] = {"trial": 5, "state": "COMPLETE", "val_loss": 0.09, "peak_mem_mb": 4.0, "outcome": "ok",
                       "health": "ok", "n_seeds": 1, "rerun_of": None}
    out, rests_on = rerun_outcomes(df, Objectives(("val_loss", "peak_mem_mb"), ("minimize", "minimize")))
    text = rerun_sentence(out, rests_on)
    assert "1 of 2 front configs held" in text and "trial 1 did not (0.09 -> 0.2 over 3 seeds)" in text
    assert text.endswith("The front now rests on trials 3, 5.")


def test_the_pairs_the_conclusions_talk_about_get_their_pictures():
    """Issue 45, item 2: a declared pair that came out 'no sign', the decided pair the README is
    about, and the strongest open ones are all drawn."""
    from types import SimpleNamespace

    from reports import Coupling
    from reports._report import _declared_pairs

    study = SimpleNamespace(user_attrs={"space": {"hypotheses": [{"x": "lr", "y": "init_std"}]}})
    couplings = [Coupling("lora_rank", "lr", 0.3, 0.12, 0.5, 40), Coupling("lora_rank", "init_std", 0.08, 0.01, 0.3, 40),
                 Coupling("steps", "lr", 0.06, 0.0, 0.25, 40), Coupling("steps", "init_std", 0.04, 0.0, 0.2, 40),
                 Coupling("lr", "init_std", 0.01, 0.0, 0.03, 40)]
    drawn = {frozenset(p) for p in _declared_pairs(study, ["lora_rank", "lr", "init_std", "steps"], couplings)}
    assert frozenset(("lora_rank", "lr")) in drawn and frozenset(("lr", "init_std")) in drawn
    assert {frozenset(("lora_rank", "init_std")), frozenset(("steps", "lr"))} <= drawn  # the two strongest open
    assert frozenset(("steps", "init_std")) not in drawn
