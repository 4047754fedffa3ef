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
    import mlflow.artifacts

    tracking = tracking_of(a, study, workdir)
    import tempfile

    for t in trials:
        folder = target / f"trial-{t.number}" if a.front else target
        folder.mkdir(parents=True, exist_ok=True)
        run_id = t.user_attrs[A.MLFLOW_RUN_ID]
        with tempfile.TemporaryDirectory() as tmp:
            into = folder if a.format == "diffusers" else Path(tmp)
            try:
                names = {f.path for f in mlflow.MlflowClient(tracking).list_artifacts(run_id)}
                for path in ("concepts", "pytorch_lora_weights.safetensors", "config.yaml"):
                    if path in names:
                        mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=path, dst_path=str(into),
                                                            tracking_uri=tracking)
            except Exception as exc:  # noqa: BLE001 - MLflow unreachable or the run's artifacts gone
                print(f"csweep: pull: cannot read trial {t.number}'s run {run_id} from {redacted(tracking)} "
                      f"({exc.__class__.__name__}: {str(exc)[:200]})", file=sys.stderr)
                return 1
            print(f"trial {t.number} -> {folder}")
            if a.format == "diffusers":
                print(_load_lines(folder))
                continue
            print(_write_kohya(into, folder, f"{study.study_name}-trial-{t.number}"))
    return 0


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
