"""Every name csweep writes onto an Optuna study or trial, in one place.

The driver writes these attributes, `resume` / `sync` / `report` read them back. This module
imports nothing, so that the reports can read a study without importing the driver.
"""

# --- study user attrs ---------------------------------------------------------------------
SPACE = "space"  # the search space as a dict (search_spaces.SearchSpace.to_dict)
OBJECTIVE = "objective"  # built-in name or module:function
SETTINGS = "csweep_run"  # the run's settings record (sweeps._settings.RunSettings)
TARGET_TRIALS = "target_trials"  # trials the runs so far asked for in all
MAX_MEM = "max_mem_mb"  # the memory budget, when one was given
PARENT_RUN = "mlflow_parent_run_id"
EXPERIMENT_ID = "mlflow_experiment_id"
SYNCED_RUNS = "mlflow_run_ids_synced"  # {trial number: run id} of runs `csweep sync` created
REQUEUED = "requeued_trials"  # trial numbers whose parameters a resume already queued again
DATA_DIGEST = "data_digest"  # content digest of the training + validation data the trials saw
STALE = "stale_trials"  # {trial number: reason} of RUNNING trials a resume found and failed
# the scramble seed of the study's Sobol sequence (--sampler qmc, coupling's start): fixed by its
# first run (--seed, or drawn), so that every rerun and every driver continues one sequence
QMC_SEED = "qmc_seed"

# --- trial user attrs ---------------------------------------------------------------------
MLFLOW_RUN_ID = "mlflow_run_id"
NODE_ID = "node_id"
HEALTH = "health"
OUTCOME = "outcome"  # ok | pruned | out_of_memory | failed (sweeps._result.Kind)
FAIL_REASON = "fail_reason"
PRUNE_REASON = "prune_reason"
OUT_OF_MEMORY = "oom"  # True on a trial that ran out of memory
REPLACED = "replaced"  # a trial whose parameters are run again (stale, interrupted)
ATTEMPTS = "attempts"
PREDICTED_MEM = "predicted_mem_mb"  # --gpu-mem-mb: the peak the packing reserved for the trial's (last) start
PACKED_START = "packed_start"  # --gpu-mem-mb: when the trial's (last) start was placed (epoch s)
REPACKED = "repacked"  # True on a trial that ran out of memory sharing a GPU and ran again alone
N_SEEDS = "n_seeds"
SEEDS = "seeds"
# with --seeds K: each replicate's health label (a stopped replicate's "pruned"), so that the
# stability analysis reads every run and a config whose seeds disagree is "at the edge"
REPLICATE_HEALTH = "replicate_health"
VAL_LOSS_STD = "val_loss_std"
VAL_LOSS_SEM = "val_loss_sem"
VAL_LOSS_REPLICATES = "val_loss_replicates"
FIDELITY = "fidelity"  # concept fidelity of the trial's samples, when it drew any
FIDELITY_STD = "fidelity_std"  # with --seeds K > 1: the replicates' std, sem and values
FIDELITY_SEM = "fidelity_sem"
FIDELITY_REPLICATES = "fidelity_replicates"
CONCEPTS_SHOWN = "samples_show"  # per concept, whether the trial's samples show it: {name: 0 or 1}
VAL_CURVE = "val_curve"  # [[step, val_loss], ...] of the validations during training
BEST_STEP = "best_step"  # the validated step with the lowest val_loss
VAL_LOSS_AT_BEST = "val_loss_at_best"
STEPS_RUN = "steps_run"  # optimizer steps the trial trained (fewer than planned when stopped)
STEPS_PLANNED = "steps_planned"  # the steps it was configured for
PEAK_MEM_SEEN = "peak_mem_mb_seen"  # a pruned trial's peak memory up to its stop
RUNG = "rung"  # --early-stop dominated: the rung (1, 2, ...) at which the trial was stopped
RERUN_OF = "rerun_of"  # `csweep rerun-front`: the trial whose config this one re-trains

# --- MLflow run tags ------------------------------------------------------------------------
# A trial's run carries its reason under the trial attr's own name (FAIL_REASON, PRUNE_REASON)
# and its seeds under SEEDS; MLflow's own tags (parent run, note) are mlflow.utils.mlflow_tags'.
TAG_ROLE = "csweep.role"  # "study" on a study's parent run
TAG_STUDY = "optuna.study_name"
TAG_TRIAL = "optuna.trial_number"
TAG_STATE = "optuna.state"  # the trial's Optuna state: COMPLETE | PRUNED | FAIL
TAG_OUTCOME = "csweep.outcome"  # OUTCOME's value
TAG_NODE = "ray.node_id"
TAG_INFEASIBLE = "infeasible"  # why the trial is not a feasible point (out of memory)


def is_replaced(study, t) -> bool:
    """A trial whose parameters are run again: a stale RUNNING trial of a dead driver (failed
    by a resume) or one interrupted by Ctrl-C."""
    return bool(t.user_attrs.get(REPLACED)) or str(t.number) in study.user_attrs.get(STALE, {})
