"""Commands that work on a stored study without Ray: report (MLflow unreachable), rerun-front's
bad input, params."""

from __future__ import annotations

import socket

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from common import attrs as A
from sweeps import main


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _study(tmp_path, name="st", *, complete=True):
    workdir = tmp_path / "csweep_runs"
    workdir.mkdir(exist_ok=True)
    storage = f"sqlite:///{workdir / 'optuna.db'}"
    study = optuna.create_study(study_name=name, storage=storage, directions=["minimize", "minimize"])
    study.set_user_attr(A.PARENT_RUN, "0123456789abcdef")
    for i in range(6):
        x = i / 5
        if complete:
            study.add_trial(create_trial(values=[(x - 0.4) ** 2, 10 * x], params={"x": x},
                                         distributions={"x": FloatDistribution(0, 1)}))
        else:
            study.add_trial(create_trial(state=TrialState.FAIL, params={"x": x},
                                         distributions={"x": FloatDistribution(0, 1)}))
    return workdir, storage


def test_report_with_mlflow_unreachable_writes_the_local_reports_and_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "3")
    workdir, _ = _study(tmp_path)
    rc = main(["report", "st", "--workdir", str(workdir), "--tracking-uri", f"http://127.0.0.1:{_free_port()}"])
    out = capsys.readouterr()
    assert rc == 0
    assert (workdir / "reports/st/index.html").is_file() and (workdir / "reports/st/pareto.csv").is_file()
    lines = [line for line in out.err.splitlines() if "MLflow" in line]
    assert len(lines) == 1 and "was not updated" in lines[0] and "local reports are written" in lines[0]
    assert "Traceback" not in out.err


def test_rerun_front_refuses_an_unknown_study_and_an_empty_front(tmp_path, capsys):
    workdir, _ = _study(tmp_path, complete=False)

    def files() -> list[str]:  # less SQLite's own -wal/-shm, there while a connection is open
        return sorted(p.name for p in workdir.iterdir() if not p.name.endswith(("-wal", "-shm")))

    before = files()
    assert main(["rerun-front", "nope", "--workdir", str(workdir)]) == 2
    assert "study 'nope': not in storage" in capsys.readouterr().err
    assert main(["rerun-front", "st", "--workdir", str(workdir)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "front is empty" in err[0]
    assert files() == before  # nothing written


@pytest.mark.parametrize("argv", [["--seeds", "0"], ["--seeds", "-2"], ["--seeds", "two"]])
def test_bad_seed_counts_are_refused(tmp_path, capsys, argv):
    with pytest.raises(SystemExit) as exit_:
        main(["run", "warmup_init", "--workdir", str(tmp_path / "w"), *argv])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--seeds" in err[0]
    assert not (tmp_path / "w").exists()


def test_params_lists_every_builtin_parameter_with_its_default(capsys):
    from objectives import TEXTUAL_INVERSION_PARAMS

    assert main(["params"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(TEXTUAL_INVERSION_PARAMS)
    assert "lr" in lines[1] and "0.005" in lines[1]
    # defaults as YAML takes them, every rule in one column however long the name
    by_name = {line.split()[0]: line for line in lines}
    assert by_name["lora_alpha"].split()[1] == "null" and by_name["gradient_checkpointing"].split()[1] == "false"
    assert len({line.index(TEXTUAL_INVERSION_PARAMS[n].rule) for n, line in by_name.items()}) == 1


def test_numbers_as_people_write_them_are_accepted_everywhere(tmp_path, monkeypatch):
    from sweeps.commands import build_parser
    from sweeps.commands.run import run_config

    space = tmp_path / "s.yaml"
    space.write_text("name: s\nparams:\n  lr: {type: float, low: 1e-5, high: 1e-2, log: true}\n"
                     "  init_std: {type: categorical, choices: [1e-3, 1e-2]}\nfixed:\n  steps: 4\n"
                     "  embedding_lr_ratio: 3e-1\n")
    argv = ["run", str(space), "--workdir", str(tmp_path / "w"), "--set", "max_grad_norm=1e0",
            "--health", "degrade_p=1e-3"]
    cfg = run_config(build_parser().parse_args(argv))
    lr = cfg.space.params[0]
    assert (lr.low, lr.high) == (1e-5, 1e-2)
    assert cfg.space.params[1].choices == (1e-3, 1e-2)
    assert cfg.fixed["embedding_lr_ratio"] == 0.3 and cfg.fixed["max_grad_norm"] == 1.0
    assert cfg.health["degrade_p"] == 1e-3


def test_a_malformed_number_is_still_one_line_exit_2(tmp_path, capsys):
    rc = main(["run", "warmup_init", "--workdir", str(tmp_path / "w"), "--set", "lr=1e-4x"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "lr must be a float > 0, got '1e-4x'" in err[0]
    assert not (tmp_path / "w").exists()


def test_dry_run_trains_configs_for_two_steps_and_writes_nothing(tmp_path, capsys, monkeypatch):
    """`csweep run SPACE --dry-run N`: N of the space's configs, 2 steps each, peak memory and step
    time printed, the ones above --max-mem-mb flagged, no storage, no MLflow, no workdir."""
    monkeypatch.chdir(tmp_path)
    rc = main(["run", "lora_embed", "--dry-run", "2", "--max-mem-mb", "20", "--workdir", str(tmp_path / "w")])
    out = capsys.readouterr().out
    assert rc == 0, out
    lines = [ln for ln in out.splitlines() if ln.startswith("  ")]
    assert len(lines) == 2 and all("peak" in ln and "MB" in ln and "step" in ln for ln in lines), out
    assert all("lora_rank=" in ln and "embedding_dim=" in ln for ln in lines)
    above = [ln for ln in lines if "ABOVE --max-mem-mb 20" in ln]
    peaks = [float(ln.split("peak ")[1].split(" MB")[0]) for ln in lines]
    assert len(above) == sum(p > 20 for p in peaks)
    assert "nothing was added to any study" in out
    assert not (tmp_path / "w").exists() and not list(tmp_path.iterdir())
    # early stops beside a coupling question: a note before anything runs (the stopped trials
    # are out of the coupling fits), and the run goes on
    rc = main(["run", "lora_embed", "--dry-run", "1", "--sampler", "coupling", "--early-stop", "dominated",
               "--workdir", str(tmp_path / "w")])
    err = capsys.readouterr().err
    assert rc == 0 and "note: --early-stop dominated keeps the trials it stops out of the coupling fits" in err
    assert "--sampler coupling has fewer trials" in err


def test_pull_says_which_seeds_weights_it_writes_and_picks_another(tmp_path, monkeypatch, capsys):
    """Issue 45, item 6: a trial of --seeds 2 scores their mean; pull writes its first seed's
    weights unless --seed picks another, says which, one line per file, no progress bars; a seed
    the trial never trained is refused before anything is written."""
    import mlflow
    import numpy as np
    import optuna
    from safetensors.numpy import save

    monkeypatch.chdir(tmp_path)
    work = tmp_path / "csweep_runs"
    work.mkdir()
    client = mlflow.MlflowClient(f"sqlite:///{work / 'mlflow.db'}")
    exp = client.create_experiment("s", artifact_location=(work / "mlartifacts").as_uri())
    run = client.create_run(exp)
    files = {"concepts/dog/learned_embeds.safetensors": save({"<dog>": np.zeros((1, 4), np.float32)}),
             "replicates/seed1/concepts/dog/learned_embeds.safetensors": save({"<dog>": np.ones((1, 4), np.float32)}),
             "config.yaml": b"lr: 0.01\nseed: 0\n"}
    for name, blob in files.items():
        path = tmp_path / "up" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(blob)
    client.log_artifacts(run.info.run_id, str(tmp_path / "up"))
    study = optuna.create_study(study_name="s", storage=f"sqlite:///{work / 'optuna.db'}",
                                directions=["minimize", "minimize"])
    t = study.ask({"lr": optuna.distributions.FloatDistribution(1e-3, 1e-1, log=True)})
    t.set_user_attr(A.MLFLOW_RUN_ID, run.info.run_id)
    t.set_user_attr(A.SEEDS, [0, 1])
    study.tell(t, [0.1, 10.0])
    capsys.readouterr()

    assert main(["pull", "s", "--trial", "0", str(tmp_path / "bad"), "--seed", "5"]) == 2
    assert "pull --seed 5: trial 0 trained seed(s) 0, 1 only" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()

    assert main(["pull", "s", "--trial", "0", str(tmp_path / "first")]) == 0
    out = capsys.readouterr()
    assert "trial 0, seed 0 of its seeds 0, 1 (its val_loss is their mean; --seed picks another)" in out.out
    assert "Downloading" not in out.err + out.out
    from safetensors.numpy import load_file

    assert load_file(str(tmp_path / "first/concepts/dog/learned_embeds.safetensors"))["<dog>"].sum() == 0

    assert main(["pull", "s", "--trial", "0", str(tmp_path / "second"), "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert "trial 0, seed 1 of its seeds 0, 1" in out
    written = sorted(p.relative_to(tmp_path / "second").as_posix() for p in (tmp_path / "second").rglob("*")
                     if p.is_file())
    assert written == ["concepts/dog/learned_embeds.safetensors", "config.yaml"]
    assert all(f"  wrote {tmp_path / 'second' / w}" in out for w in written)
    assert load_file(str(tmp_path / "second/concepts/dog/learned_embeds.safetensors"))["<dog>"].sum() == 4
    assert "seed: 1" in (tmp_path / "second/config.yaml").read_text()
