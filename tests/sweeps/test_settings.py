"""One settings record: every `csweep run` option survives a resume; one module of attribute
names that imports nothing; no import cycles; the private Optuna routines still behave."""

from __future__ import annotations

import ast
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ANALYTIC_OBJECTIVE, ROOT

from sweeps.commands import build_parser
from sweeps.commands.run import run_config
from sweeps import RunConfig

# what each per-invocation field is given by when `csweep resume` runs the study again
RESUME_GIVES = {"study_name", "trials", "workers", "workdir", "storage", "ray_address", "progress",
                "reports", "artifact_root", "enqueue", "enqueue_attrs", "seed_offset",
                "trials_are_runs"}


def option_values(tmp: Path) -> dict[str, list[str]]:
    """A non-default value for every option of `csweep run`."""
    data = tmp / "data" / "mug"
    data.mkdir(parents=True)
    from PIL import Image

    for i in range(2):
        Image.new("RGB", (16, 16), (40 * i, 0, 0)).save(data / f"{i}.png")
    clip = tmp / "clip"  # what check_fidelity_model reads (the weights are not loaded here)
    clip.mkdir()
    (clip / "config.json").write_text('{"model_type": "clip_vision_model"}')
    (clip / "preprocessor_config.json").write_text("{}")
    (clip / "model.safetensors").write_bytes(b"")
    return {
        "--trials": ["7"], "--workers": ["3"], "--study": ["other"], "--workdir": [str(tmp / "wd")],
        "--storage": [f"sqlite:///{tmp}/o.db"], "--tracking-uri": [f"sqlite:///{tmp}/m.db"],
        "--ray-address": ["auto"], "--sampler": ["random"], "--seed": ["5"], "--seeds": ["3"],
        "--model": ["tiny-sdxl"], "--data": [str(tmp / "data")], "--set": ["steps=3"],
        "--objective": ["userobj:objective"], "--max-mem-mb": ["100"], "--cpus-per-trial": ["2"],
        "--gpus-per-trial": ["0.5"], "--gpu-mem-mb": ["40000"], "--max-retries": ["3"], "--max-fail-share": ["0.7"],
        "--no-early-stop": [], "--health": ["patience=5"], "--no-progress": [],
        "--samples": ["3"], "--no-samples": [], "--fidelity-model": [str(clip)],
        "--objectives": ["fidelity,val_loss,peak_mem_mb"], "--until-decisive": [],
        "--early-stop": ["dominated"], "--rungs": ["0.2,0.5"], "--score": ["best"], "--profile": ["sd15"],
        "--seed-plan": ["design", "--sampler", "coupling", "--seeds", "2"],
    }


def comparable(value):
    return value.to_dict() if hasattr(value, "to_dict") else value


def run_options() -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices["run"]
    return {a.option_strings[-1] for a in sub._actions if a.option_strings and a.dest != "help"}


def test_every_run_option_survives_a_resume(tmp_path, monkeypatch):
    (tmp_path / "userobj.py").write_text(ANALYTIC_OBJECTIVE)
    monkeypatch.chdir(tmp_path)
    values = option_values(tmp_path)
    # --dry-run is an action, not a setting: it trains a few configs and writes no study at all;
    # --allow-pickle lets --model be a .ckpt, whose safe copy is then the setting (--model's)
    assert set(values) == run_options() - {"--dry-run", "--allow-pickle"}, \
        "a new `run` option needs a value here (and a path through resume)"
    parser = build_parser()
    base_argv = ["run", "warmup_init", "--workdir", str(tmp_path / "base")]
    base = run_config(parser.parse_args(base_argv))
    stored_fields = set(RunConfig.stored_fields())
    assert stored_fields.isdisjoint(RESUME_GIVES)
    assert set(RunConfig.per_invocation_fields()) <= RESUME_GIVES
    for option, value in values.items():
        cfg = run_config(parser.parse_args(base_argv + [option, *value]))
        changed = {f.name for f in dataclasses.fields(RunConfig) if getattr(cfg, f.name) != getattr(base, f.name)}
        assert changed, f"{option} changed nothing in the settings record"
        # what the study keeps, as JSON, and the config a resume builds from it
        stored = json.loads(json.dumps(cfg.stored()))
        again = RunConfig.from_stored(stored, source="<study>", study_name=cfg.study_name, trials=1,
                                      workers=cfg.workers, workdir=cfg.workdir, storage=cfg.storage)
        for name in stored_fields:
            assert comparable(getattr(again, name)) == comparable(getattr(cfg, name)), \
                f"{option}: {name} did not survive a resume"
        for name in changed - stored_fields:
            assert name in RESUME_GIVES, f"{option} sets {name}, which neither the study nor resume keeps"


def test_attribute_names_live_in_one_module_that_imports_nothing():
    tree = ast.parse((ROOT / "common" / "attrs.py").read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    # the attribute names are not retyped as bare strings where they are used
    named = {n.targets[0].id: n.value.value for n in tree.body
             if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)}
    names = set(named.values())
    # the MLflow tags and the reason names appear nowhere else as a bare string
    tags = {v for k, v in named.items() if k.startswith("TAG_") or k in ("FAIL_REASON", "PRUNE_REASON")}
    assert "optuna.trial_number" in tags and "fail_reason" in tags
    offenders = []
    for package in ("sweeps", "reports", "common"):
        for path in (ROOT / package).rglob("*.py"):
            if path.name == "attrs.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and getattr(node.func, "attr", "") in ("set_user_attr", "get") \
                        and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value in names:
                    offenders.append(f"{path.name}:{node.lineno} {node.args[0].value!r}")
                if isinstance(node, ast.Constant) and node.value in tags:
                    offenders.append(f"{path.name}:{node.lineno} {node.value!r}")
    assert not offenders, offenders


def _imports(path: Path, package: str) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:
                out.add(f"{package}.{node.module}" if node.module else package)
            elif node.level == 0 and node.module:
                out.add(node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


def test_no_import_cycles_between_modules():
    graph = {}
    for package in ("search_spaces", "sweeps", "objectives", "reports"):
        for path in (ROOT / package).glob("*.py"):
            mod = package if path.stem == "__init__" else f"{package}.{path.stem}"
            graph[mod] = {m for m in _imports(path, package) if m in graph or m.split(".")[0] in
                          ("search_spaces", "sweeps", "objectives", "reports")}
    modules = set(graph)
    edges = {m: {d for d in deps if d in modules and d != m} for m, deps in graph.items()}
    # package __init__ modules re-export their package: leave them out of cycle detection
    edges = {m: {d for d in ds if "." in d} for m, ds in edges.items() if "." in m}
    seen, stack, cycles = set(), [], []

    def visit(m: str) -> None:
        if m in stack:
            cycles.append(stack[stack.index(m):] + [m])
            return
        if m in seen:
            return
        seen.add(m)
        stack.append(m)
        for d in sorted(edges.get(m, ())):
            visit(d)
        stack.pop()

    for m in sorted(edges):
        visit(m)
    assert not cycles, cycles
    # and the reports never import the driver's modules, only its names
    assert {d for m, ds in edges.items() if m.startswith("reports.") for d in ds if d.startswith("sweeps.")} \
        <= {"common.attrs"}


def test_private_optuna_routines_still_behave():
    """csweep uses Optuna's private Pareto and hypervolume routines (no public ones take plain
    points) under an upper bound on Optuna's version: this fails loudly when they move."""
    import optuna
    from optuna._hypervolume import compute_hypervolume
    from optuna.study._multi_objective import _is_pareto_front

    pts = np.array([[1.0, 3.0], [2.0, 2.0], [3.0, 1.0], [3.0, 3.0], [2.0, 2.0]])
    assert _is_pareto_front(pts, assume_unique_lexsorted=False).tolist() == [True, True, True, False, True]
    assert compute_hypervolume(pts[:3], np.array([4.0, 4.0])) == pytest.approx(6.0)
    major = int(optuna.__version__.split(".")[0])
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'"optuna>=4.2,<{major + 1}"' in pyproject or '"optuna>=4.2,<6"' in pyproject


def test_reports_import_without_the_driver_or_torch():
    code = ("import sys, reports; print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'ray', 'mlflow') or m in ('sweeps._driver', 'sweeps._runner')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
