"""End to end, as a user runs it: `csweep run` on Ray workers, Optuna storage, MLflow, reports."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from helpers import load

pytestmark = pytest.mark.slow  # starts Ray and runs real sweeps
# the tests that read one module-wide sweep run in one test process (-n: --dist loadgroup)
SAME_SWEEP = pytest.mark.xdist_group("tiny_sweep")

STEPS = 8


def non_dominated(df: pd.DataFrame) -> set[int]:
    """The trials no other beats on all three objectives (val_loss and memory minimized,
    fidelity maximized)."""
    done = df[df["state"] == "COMPLETE"]
    pts = list(zip(done["trial"], done["val_loss"], done["peak_mem_mb"], done["fidelity"]))
    return {
        n for n, a, b, c in pts
        if not any(x <= a and y <= b and z >= c and (x < a or y < b or z > c) for _, x, y, z in pts)
    }


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory, cli):
    """Two runs of the same command: 4 trials on 2 workers, then 2 more; fidelity is the study's
    third objective."""
    cwd = tmp_path_factory.mktemp("user")
    args = ("run", "warmup_init", "--workers", "2", "--set", f"steps={STEPS}", "--set", "lora_rank=2",
            "--samples", "1", "--seed", "7", "--objectives", "val_loss,peak_mem_mb,fidelity", "--no-progress")
    first = cli(*args, "--trials", "4", cwd=cwd)
    storage = f"sqlite:///{cwd / 'csweep_runs' / 'optuna.db'}"
    tracking = f"sqlite:///{cwd / 'csweep_runs' / 'mlflow.db'}"
    snapshot = {
        "parent": optuna.load_study(study_name="warmup_init", storage=storage).user_attrs["mlflow_parent_run_id"],
        "trials": pd.read_csv(cwd / "csweep_runs/reports/warmup_init/trials.csv"),
    }
    second = cli(*args, "--trials", "2", cwd=cwd)
    return cwd, first, second, storage, tracking, snapshot


@SAME_SWEEP
def test_run_completes_and_says_where_results_are(tiny_sweep):
    cwd, first, second, *_ = tiny_sweep
    assert first.returncode == 0, first.stderr
    assert second.returncode == 0, second.stderr
    assert "4 completed, 0 failed" in first.stdout
    assert "reports: csweep_runs/reports/warmup_init" in first.stdout
    assert "csweep ui --workdir csweep_runs" in first.stdout


@SAME_SWEEP
def test_storage_holds_every_trial_with_run_ids_and_nodes(tiny_sweep):
    _, _, _, storage, _, snapshot = tiny_sweep
    study = optuna.load_study(study_name="warmup_init", storage=storage)
    assert [d.name for d in study.directions] == ["MINIMIZE", "MINIMIZE", "MAXIMIZE"]
    assert study.metric_names == ["val_loss", "peak_mem_mb", "fidelity"]
    trials = study.trials
    assert [t.number for t in trials] == list(range(6))
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    assert all(t.user_attrs["mlflow_run_id"] and t.user_attrs["node_id"] for t in trials)
    assert set(trials[0].params) == {"warmup_steps", "init_std"}
    # the rerun added trials to the same study and reattached to the same parent run
    assert len(snapshot["trials"]) == 4
    assert study.user_attrs["mlflow_parent_run_id"] == snapshot["parent"]


@SAME_SWEEP
def test_mlflow_parent_and_nested_children(tiny_sweep):
    _, _, _, storage, tracking, _ = tiny_sweep
    client = MlflowClient(tracking_uri=tracking)
    exp = client.get_experiment_by_name("warmup_init")
    runs = client.search_runs([exp.experiment_id], max_results=100)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(children) == 6
    study = optuna.load_study(study_name="warmup_init", storage=storage)
    by_number = {t.number: t for t in study.trials}
    for run in children:
        assert run.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        assert run.info.status == "FINISHED"
        trial = by_number[int(run.data.tags["optuna.trial_number"])]
        assert trial.user_attrs["mlflow_run_id"] == run.info.run_id
        assert run.data.params["steps"] == str(STEPS)
        assert float(run.data.params["init_std"]) == pytest.approx(trial.params["init_std"])
        assert run.data.params["warmup_steps"] == str(trial.params["warmup_steps"])
        assert run.data.metrics["val_loss"] == pytest.approx(trial.values[0])
        assert run.data.metrics["peak_mem_mb"] == pytest.approx(trial.values[1])
        history = client.get_metric_history(run.info.run_id, "train_loss")
        assert sorted(m.step for m in history) == list(range(STEPS))
        assert len(client.get_metric_history(run.info.run_id, "lr")) == STEPS
        assert run.data.tags["peak_mem_source"] == "cpu_accounting"
        names = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {"config.yaml", "concepts"} <= names
        embeds = {a.path for a in client.list_artifacts(run.info.run_id, "concepts/red-circle")}
        assert embeds == {"concepts/red-circle/learned_embeds.safetensors"}
    parent_files = {a.path for a in client.list_artifacts(parents[0].info.run_id, "reports")}
    assert {"reports/trials.csv", "reports/pareto.csv", "reports/pareto.md", "reports/index.html",
            "reports/summary.json", "reports/coupling.csv", "reports/scaling.csv"} <= parent_files


@SAME_SWEEP
def test_every_trial_draws_samples_seen_in_mlflow_and_the_report(tiny_sweep):
    cwd, _, _, storage, tracking, _ = tiny_sweep
    client = MlflowClient(tracking_uri=tracking)
    study = optuna.load_study(study_name="warmup_init", storage=storage)
    for t in study.trials:
        run_id = t.user_attrs["mlflow_run_id"]
        files = {a.path for a in client.list_artifacts(run_id, "samples")}
        assert {f"samples/{c}.png" for c in ("red-circle", "green-square", "blue-stripes")} == files
        images = [a.path for a in client.list_artifacts(run_id, "images")]  # mlflow.log_image's image view
        assert any("samples" in p for p in images), images
        run = client.get_run(run_id)
        assert -1 <= run.data.metrics["fidelity"] <= 1 and run.data.metrics["sample_seconds"] > 0
        assert t.user_attrs["fidelity"] == pytest.approx(run.data.metrics["fidelity"]) == pytest.approx(t.values[2])
        # the data it saw, as MLflow dataset inputs (the UI's Dataset column), digests the study's
        inputs = {(d.dataset.name, d.dataset.digest, {t.key: t.value for t in d.tags}["mlflow.data.context"])
                  for d in run.inputs.dataset_inputs}
        digest = study.user_attrs["data_digest"].split("-")
        assert inputs == {("synthetic-training", digest[0], "training"), ("synthetic-validation", digest[1], "validation")}
        # kept beside the study too, where the report finds them
        assert (cwd / f"csweep_runs/samples/warmup_init/{t.number}/red-circle.png").is_file()
    parent = study.user_attrs["mlflow_parent_run_id"]
    assert any("training_images" in a.path for a in client.list_artifacts(parent, "images"))
    page = (cwd / "csweep_runs/reports/warmup_init/index.html").read_text()
    front = pd.read_csv(cwd / "csweep_runs/reports/warmup_init/pareto.csv")
    assert all(f"id='samples-{int(n)}'" in page for n in front["trial"])
    # fidelity beside the objectives, in the tables and the gallery
    assert front["fidelity"].between(-1, 1).all() and "fidelity " in page


@SAME_SWEEP
def test_pull_writes_what_diffusers_loads(tiny_sweep, tmp_path, monkeypatch, capsys):
    """`csweep pull` a trial (and the front), then a fresh process loads it into the pipeline."""
    import subprocess
    import sys

    from helpers import in_process

    cwd, *_ = tiny_sweep
    cli = in_process(cwd, monkeypatch, capsys)
    res = cli("pull", "warmup_init", "--trial", "1", str(tmp_path / "t1"))
    assert res.returncode == 0, res.stderr
    assert "pipe.load_textual_inversion(" in res.stdout and "pipe.load_lora_weights(" in res.stdout
    assert {p.name for p in (tmp_path / "t1").iterdir()} == {"concepts", "pytorch_lora_weights.safetensors",
                                                                "config.yaml"}
    assert "lora_rank: 2" in (tmp_path / "t1/config.yaml").read_text()
    res = cli("pull", "warmup_init", "--front", str(tmp_path / "front"))
    assert res.returncode == 0, res.stderr
    front = pd.read_csv(cwd / "csweep_runs/reports/warmup_init/pareto.csv")
    assert {p.name for p in (tmp_path / "front").iterdir()} == {f"trial-{int(n)}" for n in front["trial"]}
    assert cli("export-model", "tiny", str(tmp_path / "model")).returncode == 0
    lines = [ln.strip() for ln in res.stdout.splitlines() if ln.strip().startswith("pipe.")][:4]
    code = (
        "import sys, diffusers, safetensors.torch\n"
        f"pipe = diffusers.StableDiffusionPipeline.from_pretrained({str(tmp_path / 'model')!r})\n"
        + "\n".join(lines) + "\n"
        "img = pipe('a photo of <red-circle>', num_inference_steps=2, height=32, width=32, output_type='np').images[0]\n"
        "assert img.shape == (32, 32, 3) and img.std() > 0\n"
        "print('LOADED', len(pipe.tokenizer))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "LOADED" in out.stdout, out.stderr[-2000:]
    # kohya's layout, for AUTOMATIC1111 and ComfyUI: an embedding file per concept, one LoRA file
    res = cli("pull", "warmup_init", "--trial", "1", "--format", "kohya", str(tmp_path / "k1"))
    assert res.returncode == 0, res.stderr
    assert {p.name for p in (tmp_path / "k1").iterdir()} == {
        "red-circle.safetensors", "green-square.safetensors", "blue-stripes.safetensors",
        "warmup_init-trial-1.safetensors", "config.yaml"}
    assert "models/Lora" in res.stdout and "embeddings/" in res.stdout
    from safetensors.torch import load_file

    lora = load_file(str(tmp_path / "k1" / "warmup_init-trial-1.safetensors"))
    assert lora and all(k.startswith("lora_unet_") for k in lora)
    # bad input: a trial that is not there
    res = cli("pull", "warmup_init", "--trial", "99", str(tmp_path / "none"))
    assert res.returncode == 2 and "no completed trial 99" in res.stderr and not (tmp_path / "none").exists()


@SAME_SWEEP
def test_nothing_waits_for_sync_when_mlflow_was_up(tiny_sweep):
    cwd, *_ = tiny_sweep
    assert not (cwd / "csweep_runs/pending_mlflow").exists()


@SAME_SWEEP
def test_pareto_csv_is_exactly_the_non_dominated_trials(tiny_sweep):
    cwd, *_ = tiny_sweep
    out = cwd / "csweep_runs/reports/warmup_init"
    trials = pd.read_csv(out / "trials.csv")
    front = pd.read_csv(out / "pareto.csv")
    assert len(trials) == 6
    for col in ("trial", "state", "val_loss", "peak_mem_mb", "mlflow_run_id", "warmup_steps", "init_std"):
        assert col in trials.columns and col in front.columns
    assert set(front["trial"]) == non_dominated(trials)
    assert list(front["peak_mem_mb"]) == sorted(front["peak_mem_mb"])
    assert "Pareto front of warmup_init" in (out / "pareto.md").read_text()
    assert "maximize fidelity" in (out / "pareto.md").read_text()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["objectives"] == ["val_loss", "peak_mem_mb", "fidelity"] and len(summary["reference_point"]) == 3
    assert summary["hypervolume"] > 0


@SAME_SWEEP
def test_report_command_rewrites_from_storage(tiny_sweep, cli):
    cwd, *_ = tiny_sweep
    out = cwd / "csweep_runs/reports/warmup_init"
    before = pd.read_csv(out / "pareto.csv")
    for f in out.iterdir():
        f.unlink()
    res = cli("report", "warmup_init", cwd=cwd)
    assert res.returncode == 0, res.stderr
    pd.testing.assert_frame_equal(pd.read_csv(out / "pareto.csv"), before)
    assert len(pd.read_csv(out / "trials.csv")) == 6


def test_plugin_objective_failures_do_not_stop_the_sweep(analytic_project, csweep):
    res = csweep("run", "analytic.yaml", "--trials", "6", "--workers", "2", "--set", "fail_above=0.5",
                 "--max-fail-share", "1", "--sampler", "random", "--seed", "0", "--no-progress")
    assert res.returncode == 0, res.stderr
    study = optuna.load_study(study_name="analytic",
                              storage=f"sqlite:///{analytic_project / 'csweep_runs/optuna.db'}")
    states = {t.number: t.state.name for t in study.trials}
    assert len(states) == 6
    failed = [t for t in study.trials if t.state.name == "FAIL"]
    ok = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert failed and ok, states
    assert all(t.params["x"] > 0.5 for t in failed)
    assert all("planted failure" in t.user_attrs["fail_reason"] for t in failed)
    client = MlflowClient(tracking_uri=f"sqlite:///{analytic_project / 'csweep_runs/mlflow.db'}")
    for t in failed:
        run = client.get_run(t.user_attrs["mlflow_run_id"])
        assert run.info.status == "FAILED"
    for t in ok:
        run = client.get_run(t.user_attrs["mlflow_run_id"])
        assert run.data.metrics["extra"] == pytest.approx(t.params["x"] * t.params["y"])
    assert f"{len(ok)} completed, {len(failed)} failed" in res.stdout


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@SAME_SWEEP
def test_ui_serves_the_study_on_loopback(tiny_sweep):
    import os
    import signal
    import subprocess
    import sys
    import time
    import urllib.request

    ROOT = Path(__file__).resolve().parents[2]

    cwd, *_ = tiny_sweep
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sweeps", "ui", "--port", str(port)], cwd=cwd,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/2.0/mlflow/experiments/get-by-name"
                                            "?experiment_name=warmup_init", timeout=5) as r:
                    exp = json.load(r)["experiment"]
                break
            except OSError:
                assert proc.poll() is None and time.time() < deadline, "MLflow UI did not come up"
                time.sleep(1)
        req = urllib.request.Request(
            f"{base}/api/2.0/mlflow/runs/search", method="POST",
            data=json.dumps({"experiment_ids": [exp["experiment_id"]], "max_results": 50}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            runs = json.load(r)["runs"]
        assert len(runs) == 7  # the parent and six trials
        child = next(r for r in runs if any(t["key"] == "mlflow.parentRunId" for t in r["data"]["tags"]))
        url = f"{base}/get-artifact?path=config.yaml&run_uuid={child['info']['run_id']}"
        with urllib.request.urlopen(url, timeout=10) as r:
            config = r.read()
        # the fully resolved config: the defaults the trial ran with are in it too
        assert b"steps: 8" in config and b"precision: fp32" in config and b"lora_rank: 2" in config
        # MLflow 3's UI opens the experiment on its training runs, and the parent reads at a glance
        assert {"key": "mlflow.experimentKind", "value": "custom_model_development"} in exp["tags"]
        parent = next(r for r in runs if not any(t["key"] == "mlflow.parentRunId" for t in r["data"]["tags"]))
        tags = {t["key"]: t["value"] for t in parent["data"]["tags"]}
        assert "search space `warmup_init`" in tags["mlflow.note.content"]
        assert {m["key"] for m in parent["data"]["metrics"]} >= {"best_val_loss", "front_size", "hypervolume"}
        with urllib.request.urlopen(f"{base}/", timeout=10) as r:
            assert r.status == 200
        # the real UI in headless Chromium, opened at the link `csweep ui` prints for the study:
        # its training runs (not MLflow 3's GenAI view), the parent listed, the six trials under it
        import re
        import shutil

        lines: list[str] = []
        while not any("warmup_init:" in ln for ln in lines) and len(lines) < 5000:
            lines.append(proc.stdout.readline().decode())
        link = next(ln for ln in lines if "warmup_init:" in ln).split("warmup_init:")[1].strip()
        assert link.startswith(base) and "workflowType=machine_learning" in link
        browser = shutil.which("chromium") or shutil.which("chromium-browser")
        dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                              f"--user-data-dir={cwd / 'chromium-profile'}", "--window-size=1400,1000",
                              "--virtual-time-budget=40000", "--dump-dom", link],
                             capture_output=True, text=True, timeout=180).stdout
        text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", re.sub(r"<(script|style).*?</\1>", "", dom, flags=re.S)))
        assert "Runs" in text and "warmup_init" in text, text[:2000]
        assert "7 matching runs" in text, text[:2000]  # the parent and its six trials
        assert "Observability" not in text  # not the GenAI view
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def test_seed_replicates_and_rerun_front(analytic_project, csweep):
    seeds = analytic_project / "seeds"
    seeds.mkdir()
    res = csweep("run", "analytic.yaml", "--trials", "5", "--workers", "2", "--seeds", "2", "--set", "noise=0.01",
                 "--set", f"seeds_dir={seeds}", "--no-progress")
    assert res.returncode == 0, res.stderr
    study, client = load(analytic_project)
    for t in study.trials:
        assert t.user_attrs["n_seeds"] == 2 and t.user_attrs["seeds"] == [0, 1]
        reps = t.user_attrs["val_loss_replicates"]
        assert t.values[0] == pytest.approx(sum(reps) / 2) and t.user_attrs["val_loss_std"] > 0
        run = client.get_run(t.user_attrs["mlflow_run_id"])
        assert run.data.metrics["val_loss_sem"] == pytest.approx(t.user_attrs["val_loss_sem"])
        history = client.get_metric_history(run.info.run_id, "replicate_val_loss")
        assert [m.value for m in sorted(history, key=lambda m: m.step)] == pytest.approx(reps)
        # the plug-in got each replicate's seed as params["seed"]
        assert {f"{t.params['x']:.6f}-0", f"{t.params['x']:.6f}-1"} <= {p.name for p in seeds.iterdir()}
    summary = json.loads((analytic_project / "csweep_runs/reports/analytic/summary.json").read_text())
    assert summary["noise_floor_std"] > 0 and summary["noise_floor_dof"] == 5
    front = pd.read_csv(analytic_project / "csweep_runs/reports/analytic/pareto.csv")
    assert front["p_front"].between(0, 1).all() and front["val_loss_sem"].notna().all()
    # the front re-trained with 3 fresh seeds: new trials, same configs, seeds none used before
    res = csweep("rerun-front", "analytic", "--seeds", "3", "--workers", "2", "--no-progress")
    assert res.returncode == 0, res.stderr
    study, _ = load(analytic_project)
    new = study.trials[5:]
    assert len(new) == len(front)
    assert sorted(t.params["x"] for t in new) == sorted(front["x"])
    assert all(t.user_attrs["n_seeds"] == 3 and t.user_attrs["seeds"] == [2, 3, 4] for t in new)
    # each new trial names the front trial it re-trains, in storage and in the trials table
    by_number = {t.number: t for t in study.trials}
    assert sorted(t.user_attrs["rerun_of"] for t in new) == sorted(front["trial"])
    assert all(t.params == by_number[t.user_attrs["rerun_of"]].params for t in new)
    table = pd.read_csv(analytic_project / "csweep_runs/reports/analytic/trials.csv")
    assert table["rerun_of"].iloc[5:].astype(int).tolist() == [t.user_attrs["rerun_of"] for t in new]
    assert table["rerun_of"].iloc[:5].isna().all()
    # and it says whether the front held under the fresh seeds, per config, on the page too
    summary = json.loads((analytic_project / "csweep_runs/reports/analytic/summary.json").read_text())
    assert sorted(r["trial"] for r in summary["reruns"]) == sorted(front["trial"])
    assert f"of {len(front)} front configs held" in res.stdout and "The front now rests on trials" in res.stdout
    for r in summary["reruns"]:
        assert f"-> trial {r['rerun']} (" in res.stdout
        assert ("held" if r["held"] else "did not hold") in res.stdout
    assert set(summary["front_under_fresh_seeds"]).isdisjoint(summary["reruns"][i]["trial"]
                                                              for i in range(len(summary["reruns"])))
    page = (analytic_project / "csweep_runs/reports/analytic/index.html").read_text()
    assert "front configs held" in page


def test_sweeps_run_one_after_another_in_one_process_each_use_their_own_plug_in(tmp_path, monkeypatch, capsys):
    """As from a notebook: a second sweep, from another directory, in the process whose Ray the
    first one started; its workers import the plug-in module of its own directory."""
    from helpers import in_process

    for offset, name in ((0, "first"), (10, "second")):
        project = tmp_path / name
        project.mkdir()
        (project / "userobj.py").write_text(
            f"def objective(params):\n    return {{'val_loss': {offset} + params['x'], 'peak_mem_mb': 1.0}}\n")
        (project / "analytic.yaml").write_text(
            "name: analytic\nobjective: userobj:objective\nparams:\n  x: {type: float, low: 0.0, high: 1.0}\n")
        res = in_process(project, monkeypatch, capsys)("run", "analytic.yaml", "--trials", "2", "--no-progress")
        assert res.returncode == 0, res.stderr
        study, _ = load(project)
        assert [t.state.name for t in study.trials] == ["COMPLETE"] * 2
        assert all(offset <= t.values[0] <= offset + 1 for t in study.trials), [t.values for t in study.trials]


def test_relative_storage_and_tracking_urls_are_the_folder_each_command_runs_in(tmp_path, monkeypatch, capsys):
    """`--storage sqlite:///optuna.db --tracking-uri sqlite:///mlflow.db`, as from a notebook that
    runs one sweep per folder: each sweep's trials and runs land in the databases of the folder it
    ran in (MLflow keeps one store per URI string in a process: a relative one once pointed every
    later sweep at the first folder's database), and `csweep report` there reads them."""
    from helpers import in_process

    relative = ("--storage", "sqlite:///optuna.db", "--tracking-uri", "sqlite:///mlflow.db")
    for name in ("first", "second"):
        project = tmp_path / name
        project.mkdir()
        (project / "userobj.py").write_text("def objective(params):\n    return {'val_loss': params['x'], 'peak_mem_mb': 1.0}\n")
        (project / "space.yaml").write_text(
            f"name: {name}\nobjective: userobj:objective\nparams:\n  x: {{type: float, low: 0.0, high: 1.0}}\n")
        run = in_process(project, monkeypatch, capsys)
        res = run("run", "space.yaml", "--trials", "2", "--no-progress", *relative)
        assert res.returncode == 0, res.stderr
        assert run("report", name, *relative).returncode == 0
    for name, other in (("first", "second"), ("second", "first")):
        project = tmp_path / name
        study = optuna.load_study(study_name=name, storage=f"sqlite:///{project / 'optuna.db'}")
        assert [t.state.name for t in study.trials] == ["COMPLETE"] * 2
        assert other not in optuna.get_all_study_names(f"sqlite:///{project / 'optuna.db'}")
        client = MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow.db'}")
        exp = client.get_experiment_by_name(name)
        assert exp is not None and client.get_experiment_by_name(other) is None
        assert len(client.search_runs([exp.experiment_id])) == 3  # the parent and its two trials
        assert (project / "csweep_runs" / "reports" / name / "trials.csv").is_file()


def test_a_plug_in_in_a_folder_added_to_sys_path_after_ray_started_is_imported_by_the_workers(
        tmp_path, monkeypatch, capsys):
    """As a notebook does: a first sweep starts Ray; then a folder of plug-ins goes onto sys.path
    and the next sweep, from another directory, names a module there. Its workers import it from
    where the driver imports it now (they once had only the paths Ray started with, and every
    trial failed: "No module named ...")."""
    from helpers import in_process

    space = "name: {name}\nobjective: {module}:objective\nparams:\n  x: {{type: float, low: 0.0, high: 1.0}}\n"
    first = tmp_path / "first"
    first.mkdir()
    (first / "userobj.py").write_text("def objective(params):\n    return {'val_loss': params['x'], 'peak_mem_mb': 1.0}\n")
    (first / "space.yaml").write_text(space.format(name="first", module="userobj"))
    assert in_process(first, monkeypatch, capsys)("run", "space.yaml", "--trials", "2", "--no-progress").returncode == 0
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libobj.py").write_text("def objective(params):\n    return {'val_loss': 5 + params['x'], 'peak_mem_mb': 1.0}\n")
    monkeypatch.syspath_prepend(str(lib))
    second = tmp_path / "second"
    second.mkdir()
    (second / "space.yaml").write_text(space.format(name="second", module="libobj"))
    res = in_process(second, monkeypatch, capsys)("run", "space.yaml", "--trials", "2", "--no-progress")
    assert res.returncode == 0, res.stderr
    study, _ = load(second, "second")
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 2
    assert all(5 <= t.values[0] <= 6 for t in study.trials), [t.values for t in study.trials]
