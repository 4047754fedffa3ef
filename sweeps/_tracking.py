"""MLflow: experiment = study, one parent run per study, one nested child run per trial."""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

PARENT_RUN_ATTR = "mlflow_parent_run_id"


def redact(uri: str) -> str:
    """A URI with any password replaced, for printing and params."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(uri)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urlunsplit(parts._replace(netloc=netloc))
    return uri


class Tracker:
    def __init__(self, uri: str, experiment: str, *, artifact_root: Path | None = None) -> None:
        import mlflow
        from mlflow.tracking import MlflowClient

        self.uri = uri
        self._mlflow = mlflow
        self.client = MlflowClient(tracking_uri=uri)
        exp = self.client.get_experiment_by_name(experiment)
        if exp is None:
            location = (artifact_root / experiment).resolve().as_uri() if artifact_root else None
            self.experiment_id = self.client.create_experiment(experiment, artifact_location=location)
        else:
            self.experiment_id = exp.experiment_id

    # --- the study's parent run -------------------------------------------------------
    def attach_parent(self, study: Any, *, params: Mapping[str, Any]) -> str:
        """Reattach to the run id kept on the study, or create the parent run once."""
        run_id = study.user_attrs.get(PARENT_RUN_ATTR)
        if run_id:
            try:
                self.client.get_run(run_id)
                self.client.update_run(run_id, status="RUNNING")
                return run_id
            except Exception:  # noqa: BLE001 - a parent lost from tracking is recreated
                pass
        run = self.client.create_run(
            self.experiment_id, run_name=study.study_name,
            tags={"csweep.role": "study", "optuna.study_name": study.study_name},
        )
        run_id = run.info.run_id
        self._log_params(run_id, params)
        study.set_user_attr(PARENT_RUN_ATTR, run_id)
        return run_id

    def end_parent(self, run_id: str, status: str = "FINISHED") -> None:
        self.client.set_terminated(run_id, status=status)

    # --- one child run per trial -------------------------------------------------------
    def start_trial(self, parent_id: str, study_name: str, number: int, params: Mapping[str, Any]) -> str:
        run = self.client.create_run(
            self.experiment_id, run_name=f"trial-{number}",
            tags={
                "mlflow.parentRunId": parent_id,
                "optuna.trial_number": str(number),
                "optuna.study_name": study_name,
            },
        )
        self._log_params(run.info.run_id, params)
        return run.info.run_id

    def finish_trial(
        self,
        run_id: str,
        *,
        status: str,
        metrics: Mapping[str, float] = {},
        history: Mapping[str, list[float]] = {},
        tags: Mapping[str, str] = {},
        artifacts: Mapping[str, bytes] = {},
        config: Mapping[str, Any] | None = None,
    ) -> None:
        from mlflow.entities import Metric, RunTag

        import time

        now = int(time.time() * 1000)
        rows = [Metric(k, float(v), now, 0) for k, v in metrics.items() if _finite(v)]
        for key, values in history.items():
            rows += [Metric(key, float(v), now, i) for i, v in enumerate(values) if _finite(v)]
        tag_rows = [RunTag(k, str(v)) for k, v in tags.items()]
        for i in range(0, max(len(rows), 1), 1000):
            self.client.log_batch(run_id, metrics=rows[i : i + 1000], tags=tag_rows if i == 0 else [])
        files = dict(artifacts)
        if config is not None:
            import yaml

            files["config.yaml"] = yaml.safe_dump(dict(config), sort_keys=True).encode()
        if files:
            with tempfile.TemporaryDirectory() as tmp:
                for name, blob in files.items():
                    path = Path(tmp) / name
                    if not path.resolve().is_relative_to(Path(tmp).resolve()):
                        continue  # an artifact name must stay inside the run's folder
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_bytes(blob)
                self.client.log_artifacts(run_id, tmp)
        self.client.set_terminated(run_id, status=status)

    def log_files(self, run_id: str, directory: Path, artifact_path: str) -> None:
        self.client.log_artifacts(run_id, str(directory), artifact_path=artifact_path)

    def _log_params(self, run_id: str, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, _param_str(v)) for k, v in sorted(params.items())]
        for i in range(0, len(items), 100):
            self.client.log_batch(run_id, params=items[i : i + 100])


def _param_str(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v)


def _finite(v: Any) -> bool:
    try:
        return math.isfinite(float(v))
    except (TypeError, ValueError):
        return False
