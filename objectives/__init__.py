"""What one trial does: the training objectives and their parameters."""

from __future__ import annotations

from ._configs import RANDOM_MODELS
from ._export import BUILTIN_MODELS, export_model, prepare_model
from ._data import SYNTHETIC_CONCEPTS, check_data_dir
from ._health_config import HealthConfig, TrialStopped
from ._params import (
    TEXTUAL_INVERSION_PARAMS,
    ParamRule,
    check_against_model,
    check_param,
    check_val_every,
    default_val_every,
    model_limits,
    resolve_params,
)
from ._fidelity import check_fidelity_model
from ._single_file import CheckpointError, check_single_file, config_source, is_single_file, safe_copy_of_pickle
from ._samples import SampleConfig, data_digest, training_grids
from ._registry import BUILTIN_OBJECTIVES, ObjectiveSpec, check_plugin_importable, get_objective

__all__ = [
    "HealthConfig",
    "TrialStopped",
    "BUILTIN_MODELS",
    "RANDOM_MODELS",
    "export_model",
    "prepare_model",
    "BUILTIN_OBJECTIVES",
    "ObjectiveSpec",
    "ParamRule",
    "SampleConfig",
    "check_fidelity_model",
    "CheckpointError",
    "check_single_file",
    "config_source",
    "is_single_file",
    "safe_copy_of_pickle",
    "training_grids",
    "data_digest",
    "SYNTHETIC_CONCEPTS",
    "TEXTUAL_INVERSION_PARAMS",
    "check_against_model",
    "check_data_dir",
    "model_limits",
    "check_param",
    "check_val_every",
    "default_val_every",
    "check_plugin_importable",
    "get_objective",
    "resolve_params",
    # loaded on first use (they import torch)
    "Trained",
    "TrialOutput",
    "pick_device",
    "textual_inversion",
    "train",
    "write_kohya",
]


_TRAINING = {"train": "_textual_inversion", "textual_inversion": "_textual_inversion", "pick_device": "_worker_cache",
             "Trained": "_textual_inversion", "TrialOutput": "_textual_inversion", "write_kohya": "_kohya"}


def __getattr__(name: str):
    """The training run and its exports load torch: imported on first use, so that a command
    that only checks input (or lists spaces) never pays for torch."""
    if name in _TRAINING:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_TRAINING[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
