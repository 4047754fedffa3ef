"""Bad input: one line naming the thing and the rule, exit 2, nothing written, fast."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

GOOD_SPACE = "name: s\nparams:\n  init_std: {type: float, low: 0.001, high: 0.3, log: true}\n"
TWO_PARAMS = GOOD_SPACE + "  lr: {type: float, low: 0.0001, high: 0.1, log: true}\n"

BAD = [
    # (files to write, argv, words the message must hold)
    ({"s.yaml": "name: s\nparams: [\n"}, ["run", "s.yaml"], ["s.yaml", "malformed YAML"]),
    ({}, ["run", "nope"], ["'nope'", "built-ins"]),
    ({}, ["run", "warmup_int"], ["'warmup_int'", "did you mean 'warmup_init'?"]),
    ({"s.yaml": "name: s\nparams:\n  a: {type: uniform, low: 0, high: 1}\n"}, ["run", "s.yaml"],
     ["params.a.type", "'uniform'"]),
    ({"s.yaml": "name: s\nparams:\n  init_std: {type: float, low: 0.5, high: 0.1}\n"}, ["run", "s.yaml"],
     ["params.init_std.low", "0.5", "< high"]),
    ({"s.yaml": "name: s\nparams:\n  init_std: {type: float, low: 0, high: 1, log: true}\n"},
     ["run", "s.yaml"], ["params.init_std.low", "log=true"]),
    ({"s.yaml": "name: s\nparams:\n  freeze: {type: categorical, choices: []}\n"}, ["run", "s.yaml"],
     ["params.freeze.choices", "non-empty"]),
    ({"s.yaml": GOOD_SPACE + "fixed:\n  bogus_knob: 3\n"}, ["run", "s.yaml"],
     ["fixed.bogus_knob", "unknown parameter"]),
    ({"s.yaml": GOOD_SPACE + "fixed:\n  steps: 0\n"}, ["run", "s.yaml"], ["steps must be an int >= 1", "0"]),
    ({"s.yaml": "name: s\nparams:\n  init_std: {type: float, low: -1.0, high: 0.3}\n"}, ["run", "s.yaml"],
     ["params.init_std", "init_std must be a float > 0", "-1.0"]),
    ({"s.yaml": GOOD_SPACE}, ["run", "s.yaml", "--set", "lr=-1"], ["lr must be a float > 0"]),
    ({"s.yaml": GOOD_SPACE}, ["run", "s.yaml", "--set", "freeze=most"], ["freeze must be one of", "'most'"]),
    ({"s.yaml": GOOD_SPACE}, ["run", "s.yaml", "--set", "token_weight_decay=1.5"],
     ["token_weight_decay must be a float in (0, 1]", "1.5"]),
    ({"s.yaml": GOOD_SPACE}, ["run", "s.yaml", "--set", "precision=fp8"], ["precision must be one of"]),
    ({"s.yaml": GOOD_SPACE}, ["run", "s.yaml", "--set", "optimizer=sgd"], ["optimizer must be one of", "prodigy"]),
    ({"s.yaml": GOOD_SPACE}, ["run", "s.yaml", "--set", "lr_scheduler=step"], ["lr_scheduler must be one of", "cosine"]),
    ({"s.yaml": GOOD_SPACE}, ["run", "s.yaml", "--set", "prodigy_d_coef=0"], ["prodigy_d_coef must be a float > 0"]),
    ({"s.yaml": GOOD_SPACE}, ["run", "s.yaml", "--set", "lora_targets=vae"], ["lora_targets must be one of"]),
    ({"s.yaml": GOOD_SPACE}, ["run", "s.yaml", "--set", "lora_rank=-2"], ["lora_rank must be an int >= 0"]),
    ({"s.yaml": "name: s\nparams:\n  embedding_dim: {type: int, low: 4, high: 64}\n"}, ["run", "s.yaml"],
     ["params.embedding_dim", "text-encoder width 32", "64"]),
    ({"s.yaml": GOOD_SPACE}, ["run", "s.yaml", "--model", "tiny-sdxl", "--set", "unfreeze_layers=2"],
     ["unfreeze_layers must be <= the model's 1 used encoder layers"]),
    ({"s.yaml": GOOD_SPACE}, ["run", "s.yaml", "--set", "init_from=dog"], ["init_from must be 'random' or 'word:WORD'"]),
    ({"s.yaml": GOOD_SPACE}, ["run", "s.yaml", "--set", "init_std=0.1"], ["init_std", "sampled"]),
    ({"s.yaml": GOOD_SPACE}, ["run", "s.yaml", "--workers", "0"], ["--workers", ">= 1"]),
    ({"s.yaml": GOOD_SPACE}, ["run", "s.yaml", "--until-decisive"], ["--until-decisive", "no pair to decide"]),
    ({"s.yaml": GOOD_SPACE}, ["run", "s.yaml", "--sampler", "coupling"], ["--sampler coupling", "two or more"]),
    ({"s.yaml": GOOD_SPACE}, ["run", "s.yaml", "--seeds", "2", "--seed-plan", "design"],
     ["--seed-plan design", "--sampler coupling, not tpe"]),
    ({"s.yaml": TWO_PARAMS}, ["run", "s.yaml", "--sampler", "coupling", "--seed-plan", "design"],
     ["--seed-plan design", "K >= 2, got 1"]),
    ({"s.yaml": GOOD_SPACE + "fixed:\n  lr: 0.01\nhypotheses:\n  - {x: init_std, y: lr}\n"}, ["run", "s.yaml"],
     ["hypotheses[0].y", "'lr'", "a fixed param"]),
    ({"s.yaml": GOOD_SPACE + "hypotheses:\n  - {x: init_std, y: nope}\n"}, ["run", "s.yaml"],
     ["hypotheses[0].y", "'nope'", "not a param"]),
    ({}, ["ui", "--workers", "0"], ["--workers", ">= 1"]),
    ({"s.yaml": GOOD_SPACE}, ["run", "s.yaml", "--data", "missing_dir"], ["--data", "not a directory"]),
    ({"s.yaml": GOOD_SPACE, "empty/readme.txt": "x"}, ["run", "s.yaml", "--data", "empty"],
     ["--data", "no .png/.jpg"]),
    ({"s.yaml": GOOD_SPACE, "imgs/a.png": "not a png", "imgs/b.png": "x"}, ["run", "s.yaml", "--data", "imgs"],
     ["unreadable image", "a.png"]),
    ({"s.yaml": GOOD_SPACE}, ["run", "s.yaml", "--model", "no/such/model"], ["--model", "neither tiny"]),
    ({"s.yaml": GOOD_SPACE, "fake/model_index.json": "{}"}, ["run", "s.yaml", "--model", "fake"],
     ["--model", "not a diffusers folder", "unet"]),
    ({"s.yaml": GOOD_SPACE}, ["run", "s.yaml", "--storage", "notaurl"], ["--storage", "not a database URL"]),
    ({"s.yaml": GOOD_SPACE}, ["run", "s.yaml", "--storage", "oracle://x/y"], ["--storage", "dialect"]),
    ({"s.yaml": GOOD_SPACE}, ["run", "s.yaml", "--tracking-uri", "ftp://x"], ["--tracking-uri", "scheme"]),
    ({"s.yaml": GOOD_SPACE}, ["run", "s.yaml", "--objective", "nomodule_xyz:fn"],
     ["nomodule_xyz", "cannot import"]),
    ({"s.yaml": GOOD_SPACE}, ["run", "s.yaml", "--objective", "not-an-objective"], ["module:function"]),
    ({"s.yaml": GOOD_SPACE}, ["run", "s.yaml", "--sampler", "bayes"], ["--sampler", "bayes"]),
    ({"s.yaml": GOOD_SPACE}, ["run", "s.yaml", "--max-mem-mb", "-5"], ["--max-mem-mb", "> 0"]),
    ({}, ["report", "nostudy"], ["'nostudy'", "no storage"]),
    # model-family profiles
    ({"s.yaml": GOOD_SPACE + "profiles:\n  sd21: {fixed: {steps: 10}}\n"}, ["run", "s.yaml"],
     ["profiles.sd21", "unknown model family", "sd15"]),
    ({"s.yaml": GOOD_SPACE + "profiles:\n  sd15: {params: {lr: {type: float, low: 1.0e-5, high: 1.0e-3}}}\n"},
     ["run", "s.yaml"], ["profiles.sd15.params.lr", "must be a param of the space"]),
    ({"s.yaml": GOOD_SPACE + "profiles:\n  sd15: {fixed: {steps: 10}}\n"}, ["run", "s.yaml", "--profile", "sdxl"],
     ["--profile sdxl", "has profiles sd15 only"]),
    ({"s.yaml": GOOD_SPACE + "profiles:\n  sd15: {params: {init_std: {type: float, low: 0.5, high: 0.1}}}\n"},
     ["run", "s.yaml"], ["profile sd15", "params.init_std.low"]),
    # validation during training, the score, the rungs of --early-stop dominated
    ({"s.yaml": GOOD_SPACE + "fixed:\n  val_every: 0\n"}, ["run", "s.yaml"], ["fixed.val_every", "an int >= 1"]),
    ({"s.yaml": GOOD_SPACE + "fixed:\n  steps: 40\n  val_every: 50\n"}, ["run", "s.yaml"],
     ["fixed.val_every", "val_every must be <= steps (40), got 50"]),
    ({"s.yaml": GOOD_SPACE + "  steps: {type: int, low: 10, high: 80}\nfixed:\n  val_every: 20\n"}, ["run", "s.yaml"],
     ["fixed.val_every", "<= steps (10), got 20"]),
    ({"s.yaml": GOOD_SPACE, "plain.py": "def objective(params):\n    return {'val_loss': 1, 'peak_mem_mb': 1}\n"},
     ["run", "s.yaml", "--objective", "plain:objective", "--score", "best"],
     ["--score best", "'plain:objective'", "reports no curve", "generator"]),
    ({"s.yaml": GOOD_SPACE, "plain.py": "def objective(params):\n    return {'val_loss': 1, 'peak_mem_mb': 1}\n"},
     ["run", "s.yaml", "--objective", "plain:objective", "--early-stop", "dominated"],
     ["--early-stop dominated", "reports no curve"]),
    ({"s.yaml": GOOD_SPACE, "gen.py": "def objective(params):\n    yield {'step': 1, 'val_loss': 1}\n"
      "    return {'val_loss': 1, 'peak_mem_mb': 1}\n"},
     ["run", "s.yaml", "--objective", "gen:objective", "--early-stop", "dominated"],
     ["--early-stop dominated", "`steps`"]),
    ({"s.yaml": GOOD_SPACE + "fixed:\n  steps: 1\n"}, ["run", "s.yaml", "--early-stop", "dominated"],
     ["fixed.steps", "rung at step 1 of a trial of 1 steps"]),
    ({"s.yaml": GOOD_SPACE + "fixed:\n  steps: 40\n  val_every: 40\n"}, ["run", "s.yaml", "--early-stop", "dominated"],
     ["validating every 40 steps", "no validation between its first rung"]),
    ({"s.yaml": GOOD_SPACE}, ["run", "s.yaml", "--early-stop", "dominated", "--rungs", "0.5,0.2"],
     ["--rungs", "increasing fractions in (0, 1)"]),
    ({"s.yaml": GOOD_SPACE}, ["run", "s.yaml", "--early-stop", "dominated", "--rungs", "1.5"], ["--rungs", "(0, 1)"]),
    ({"s.yaml": GOOD_SPACE}, ["run", "s.yaml", "--early-stop", "dominated", "--no-early-stop"],
     ["--early-stop dominated", "--no-early-stop", "contradict"]),
    ({"s.yaml": GOOD_SPACE}, ["run", "s.yaml", "--score", "last"], ["--score", "'last'"]),
    # the study's objectives
    ({"s.yaml": GOOD_SPACE}, ["run", "s.yaml", "--objectives", "val_loss,fidelity"],
     ["--objectives", "lacks peak_mem_mb", "val_loss,peak_mem_mb,fidelity"]),
    ({"s.yaml": GOOD_SPACE}, ["run", "s.yaml", "--objectives", "val_loss,peak_mem_mb,accuracy"],
     ["--objectives", "unknown objective 'accuracy'"]),
    ({"s.yaml": GOOD_SPACE}, ["run", "s.yaml", "--objectives", "val_loss,peak_mem_mb,val_loss"],
     ["--objectives", "twice"]),
    ({"s.yaml": GOOD_SPACE}, ["run", "s.yaml", "--objectives", "val_loss,peak_mem_mb,fidelity", "--no-samples"],
     ["--objectives fidelity", "sample images", "--no-samples"]),
    # sample images (YAML samples: block and --samples)
    ({"s.yaml": GOOD_SPACE + "samples:\n  prompts: ['a photo of a dog']\n"}, ["run", "s.yaml"],
     ["s.yaml", "samples.prompts", "'a photo of a dog'", "{concept}"]),
    ({"s.yaml": GOOD_SPACE + "samples:\n  seeds: 0\n"}, ["run", "s.yaml"], ["samples.seeds", ">= 1"]),
    ({"s.yaml": GOOD_SPACE + "samples:\n  seeds: [0, -3]\n"}, ["run", "s.yaml"], ["samples.seeds", ">= 0"]),
    ({"s.yaml": GOOD_SPACE + "samples:\n  steps: -2\n"}, ["run", "s.yaml"], ["samples.steps", "1..1000", "-2"]),
    ({"s.yaml": GOOD_SPACE + "samples:\n  scheduler: magic\n"}, ["run", "s.yaml"],
     ["samples.scheduler", "'magic'", "ddim"]),
    ({"s.yaml": GOOD_SPACE + "samples:\n  colour: red\n"}, ["run", "s.yaml"], ["samples", "unknown key", "'colour'"]),
    ({"s.yaml": GOOD_SPACE + "samples: [1]\n"}, ["run", "s.yaml"], ["samples", "must be a mapping"]),
    ({"s.yaml": GOOD_SPACE}, ["run", "s.yaml", "--samples", "0"], ["--samples", ">= 1"]),
    ({"s.yaml": GOOD_SPACE}, ["run", "s.yaml", "--samples", "2", "--no-samples"], ["--samples", "--no-samples"]),
    ({"s.yaml": GOOD_SPACE}, ["run", "s.yaml", "--fidelity-model", "nowhere"], ["--fidelity-model", "'nowhere'",
                                                                                 "not a directory"]),
    ({"s.yaml": GOOD_SPACE, "enc/config.json": '{"model_type": "bert"}'}, ["run", "s.yaml", "--fidelity-model", "enc"],
     ["--fidelity-model", "'enc'", "'bert'", "CLIP or DINO"]),
    ({"s.yaml": GOOD_SPACE, "enc/config.json": '{"model_type": "clip_vision_model"}'},
     ["run", "s.yaml", "--fidelity-model", "enc"], ["--fidelity-model", "'enc'", "preprocessor_config.json"]),
]


@pytest.mark.parametrize("files,argv,words", BAD, ids=[" ".join(b[1]) for b in BAD])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, files, argv, words):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    # run in-process so we can see which heavy modules a bad input made us import
    code = (
        "import sys; from sweeps import main; rc = main(sys.argv[1:]); "
        "heavy = [m for m in ('torch', 'ray', 'diffusers', 'mlflow') if m in sys.modules]; "
        "print('HEAVY', heavy); sys.exit(rc)"
    )
    started = time.perf_counter()
    res = subprocess.run([sys.executable, "-c", code, *argv], cwd=tmp_path, capture_output=True, text=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin",
                              "PYTHONDONTWRITEBYTECODE": "1"})  # a plug-in's import is not csweep writing
    elapsed = time.perf_counter() - started
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("csweep: error: ")
    for w in words:
        assert w in lines[0]
    assert "Traceback" not in res.stderr
    if "HEAVY" in res.stdout:
        assert "HEAVY []" in res.stdout
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert elapsed < 30 or "--storage" in argv  # a generous bound: nothing heavy was started


@pytest.mark.parametrize("directions,names,argv,exists", [
    (["maximize"], None, [], "directions maximize"),
    (["minimize", "minimize"], ["val_loss", "peak_mem_mb"], ["--objectives", "val_loss,peak_mem_mb,fidelity"],
     "objectives minimize val_loss, minimize peak_mem_mb"),
], ids=["foreign", "two-objective study, three asked"])
def test_study_with_other_objectives_is_refused(tmp_path, cli, directions, names, argv, exists):
    import optuna

    url = f"sqlite:///{tmp_path / 'o.db'}"
    study = optuna.create_study(study_name="s", storage=url, directions=directions)
    if names:
        study.set_metric_names(names)
    (tmp_path / "s.yaml").write_text(GOOD_SPACE)
    res = cli("run", "s.yaml", "--storage", url, "--workdir", "wd", *argv, cwd=tmp_path)
    assert res.returncode == 2
    asked = ", ".join(f"{'maximize' if n == 'fidelity' else 'minimize'} {n}"
                      for n in (argv[1].split(",") if argv else ["val_loss", "peak_mem_mb"]))
    assert res.stderr.strip().splitlines() == [
        f"csweep: error: study 's' exists with {exists}; this run asks for {asked} (--objectives): "
        "pick another --study or match its objectives"
    ]
    assert not (tmp_path / "wd").exists()


def test_spaces_lists_builtins_without_heavy_imports(tmp_path):
    code = "import sys; from sweeps import main; main(['spaces']); print('torch' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0
    names = [line.split()[0] for line in res.stdout.splitlines()[:-1]]
    assert names == ["all8", "contrastive", "demo", "freeze", "lora_embed", "prodigy", "stability",
                     "token_decay", "trainer_knobs", "warmup_init"]
    assert res.stdout.splitlines()[-1] == "False"
