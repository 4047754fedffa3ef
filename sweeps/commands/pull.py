"""`csweep pull STUDY`: a trial's learned embeddings and LoRA, where diffusers (or, with
--format kohya, AUTOMATIC1111 and ComfyUI) load them."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ._options import UsageError, add_store_options, open_existing, redacted, tracking_of


def add_parser(sub: Any) -> None:
    pull = sub.add_parser("pull", help="write a trial's learned embeddings and LoRA where diffusers loads them")
    pull.add_argument("study")
    which = pull.add_mutually_exclusive_group(required=True)
    which.add_argument("--trial", type=int, metavar="N", help="the trial's number")
    which.add_argument("--front", action="store_true", help="every Pareto-front trial, one folder each")
    pull.add_argument("directory")
    pull.add_argument("--format", choices=("diffusers", "kohya"), default="diffusers",
                      help="diffusers' layout, or kohya's, which AUTOMATIC1111 and ComfyUI load [diffusers]")
    pull.add_argument("--seed", type=int, metavar="S",
                      help="which seed replicate's weights, when the trial trained several (--seeds K; its val_loss "
                           "is their mean) [the trial's first seed]")
    add_store_options(pull)
    pull.set_defaults(handler=cmd_pull)


def cmd_pull(a: argparse.Namespace) -> int:
    """A trial's exports from its MLflow run into DIR (concepts/NAME/learned_embeds.safetensors,
    pytorch_lora_weights.safetensors, config.yaml), and the diffusers lines that load them."""
    target = Path(a.directory)
    if target.exists() and not target.is_dir():
        raise UsageError(f"pull: {str(target)!r} exists and is not a directory")
    workdir, _, study = open_existing(a)
    from optuna.trial import TrialState

    from common import attrs as A

    complete = {t.number: t for t in study.trials if t.state == TrialState.COMPLETE}
    if a.front:
        trials = sorted(study.best_trials, key=lambda t: t.number)
        if not trials:
            raise UsageError(f"pull: study {a.study!r} has no completed trial yet")
    else:
        if a.trial not in complete:
            known = ", ".join(map(str, sorted(complete))) or "none"
            raise UsageError(f"pull: study {a.study!r} has no completed trial {a.trial} (completed: {known})")
        trials = [complete[a.trial]]
    missing = [t.number for t in trials if not t.user_attrs.get(A.MLFLOW_RUN_ID)]
    if missing:
        raise UsageError(f"pull: trial {missing[0]} has no MLflow run yet (run `csweep sync {a.study}` first)")
    import os
    import tempfile

    import yaml

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one line per file instead
    import mlflow

    tracking = tracking_of(a, study, workdir)
    client = mlflow.MlflowClient(tracking)
    # each trial's config and its seeds (a trial of --seeds K names them; one seed: its config's),
    # every --seed checked before anything is written
    configs: dict[int, dict[str, Any]] = {}
    seeds: dict[int, list[int]] = {}
    for t in trials:
        run_id = t.user_attrs[A.MLFLOW_RUN_ID]
        with tempfile.TemporaryDirectory() as tmp:
            try:
                has = any(f.path == "config.yaml" for f in client.list_artifacts(run_id))
                configs[t.number] = yaml.safe_load(Path(client.download_artifacts(run_id, "config.yaml", tmp))
                                                   .read_text()) or {} if has else {}
            except Exception as exc:  # noqa: BLE001 - MLflow unreachable or the run's artifacts gone
                _unreadable(t.number, run_id, tracking, exc)
                return 1
        seeds[t.number] = [int(s) for s in t.user_attrs.get(A.SEEDS) or [configs[t.number].get("seed", 0)]]
    if a.seed is not None:
        lacking = [n for n, s in seeds.items() if a.seed not in s]
        if lacking:
            raise UsageError(f"pull --seed {a.seed}: trial {lacking[0]} trained seed(s) "
                             f"{', '.join(map(str, seeds[lacking[0]]))} only")
    for t in trials:
        folder = target / f"trial-{t.number}" if a.front else target
        if not _pull_trial(a, study, t, folder, client, tracking, configs[t.number], seeds[t.number]):
            return 1
    return 0


def _unreadable(number: int, run_id: str, tracking: str, exc: Exception) -> None:
    print(f"csweep: pull: cannot read trial {number}'s run {run_id} from {redacted(tracking)} "
          f"({exc.__class__.__name__}: {str(exc)[:200]})", file=sys.stderr)


def _pull_trial(a: argparse.Namespace, study: Any, t: Any, folder: Path, client: Any, tracking: str,
                config: dict[str, Any], seeds: list[int]) -> bool:
    """One trial's exports into `folder`, in diffusers' or kohya's layout, one line per file;
    False (and a line on stderr) when MLflow cannot give them."""
    import shutil
    import tempfile

    import yaml

    from common import attrs as A

    folder.mkdir(parents=True, exist_ok=True)
    run_id = t.user_attrs[A.MLFLOW_RUN_ID]
    seed = a.seed if a.seed is not None else seeds[0]
    # the first replicate's files at the run's top; the others' under replicates/seedS/
    prefix = "" if seed == seeds[0] else f"replicates/seed{seed}/"
    with tempfile.TemporaryDirectory() as tmp:
        into = folder if a.format == "diffusers" else Path(tmp) / "pulled"
        try:
            names = {f.path for f in client.list_artifacts(run_id, prefix.rstrip("/") or None)}
            for name in ("concepts", "pytorch_lora_weights.safetensors"):
                if prefix + name in names:
                    (Path(tmp) / "run").mkdir(exist_ok=True)
                    got = Path(client.download_artifacts(run_id, prefix + name, str(Path(tmp) / "run")))
                    into.mkdir(parents=True, exist_ok=True)
                    (shutil.copytree(got, into / name, dirs_exist_ok=True) if got.is_dir()
                     else shutil.copy(got, into / name))
        except Exception as exc:  # noqa: BLE001 - MLflow unreachable or the run's artifacts gone
            _unreadable(t.number, run_id, tracking, exc)
            return False
        if config:  # the trial's config, with the seed whose weights these are
            into.mkdir(parents=True, exist_ok=True)
            (into / "config.yaml").write_text(yaml.safe_dump({**config, "seed": seed}, sort_keys=True))
        print(f"trial {t.number}, seed {seed}"
              + (f" of its seeds {', '.join(map(str, seeds))} (its val_loss is their mean; --seed picks another)"
                 if len(seeds) > 1 else "") + f" -> {folder}")
        if a.format == "diffusers":
            for path in sorted(p for p in folder.rglob("*") if p.is_file()):
                print(f"  wrote {path}")
            print(_load_lines(folder))
        else:
            print(_write_kohya(into, folder, f"{study.study_name}-trial-{t.number}"))
    return True


def _write_kohya(pulled: Path, folder: Path, prefix: str) -> str:
    """kohya's files (objectives._kohya) from a pulled diffusers folder, its config.yaml beside
    them; returns the lines that say where AUTOMATIC1111 and ComfyUI take them."""
    import shutil

    import yaml

    from objectives import write_kohya

    config = pulled / "config.yaml"
    alpha = None
    if config.is_file():
        alpha = (yaml.safe_load(config.read_text()) or {}).get("lora_alpha")
        shutil.copy(config, folder / "config.yaml")
    lines = []
    for path in write_kohya(pulled, folder, prefix=prefix, alpha=alpha):
        if path.stem == prefix:
            lines.append(f"  {path}: LoRA, into models/Lora (A1111: <lora:{prefix}:1> in the prompt) or "
                         "ComfyUI's models/loras (LoraLoader)")
        else:
            lines.append(f"  {path}: embedding, into embeddings/ (A1111 and ComfyUI: write {path.stem} in the "
                         f"prompt; ComfyUI: embedding:{path.stem})")
    return "\n".join(lines)


def _load_lines(folder: Path) -> str:
    """The diffusers code that loads a pulled trial into a pipeline `pipe` on the same base model
    (SDXL embeddings hold one row per text encoder, keys clip_l / clip_g)."""
    from safetensors import safe_open

    lines = []
    concepts = sorted(p for p in (folder / "concepts").iterdir() if p.is_dir()) if (folder / "concepts").is_dir() else []
    for concept in concepts:
        token, path = f"<{concept.name}>", str(concept / "learned_embeds.safetensors")
        with safe_open(path, framework="numpy") as f:
            sdxl = "clip_g" in f.keys()
        if sdxl:
            lines.append(f"state = safetensors.torch.load_file({path!r}); "
                         f"pipe.load_textual_inversion(state['clip_l'], token={token!r}, "
                         "text_encoder=pipe.text_encoder, tokenizer=pipe.tokenizer); "
                         f"pipe.load_textual_inversion(state['clip_g'], token={token!r}, "
                         "text_encoder=pipe.text_encoder_2, tokenizer=pipe.tokenizer_2)")
        else:
            lines.append(f"pipe.load_textual_inversion({str(concept)!r}, token={token!r})")
    if (folder / "pytorch_lora_weights.safetensors").is_file():
        lines.append(f"pipe.load_lora_weights({str(folder)!r})")
    return "\n".join(f"  {line}" for line in lines)
