"""MLflow: experiment = study, one parent run per study, one nested child run per trial."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import sqlite3
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from common import attrs as A

# MLflow 3 opens an experiment in its GenAI (traces) view unless it says it holds training runs
EXPERIMENT_KIND_TAG = ("mlflow.experimentKind", "custom_model_development")


SAMPLES_DIR = "samples/"


def seed_store(uri: str) -> None:
    """A local SQLite store that does not exist yet starts as a copy of an empty one that this
    MLflow made before on this machine (`empty_store`), instead of MLflow creating it and running
    its schema's migrations on it: about a second of CPU at every first sweep in a folder
    (benchmarks/RESULTS.md). MLflow then opens it as a store of its own version and adds its
    Default experiment, as on a store it made. Where anything goes wrong the store is left to
    MLflow, and a store another process made meanwhile is never replaced."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:  # read as check_storage_url reads a storage URL: SQLAlchemy's own parse
        url = make_url(uri)
    except ArgumentError:
        return
    path = url.database if url.get_backend_name() == "sqlite" and not url.query else None
    if not path or path.startswith((":memory:", "file:")) or os.path.exists(path):
        return
    folder = os.path.dirname(os.path.abspath(path))
    empty = empty_store() if os.path.isdir(folder) else None  # no folder: MLflow says so, as before
    if empty is None:
        return
    try:
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            copy = os.path.join(tmp, "store.db")
            shutil.copyfile(empty, copy)
            with contextlib.suppress(FileExistsError):  # another driver's store: theirs stays
                os.link(copy, path)
    except OSError:  # a folder it may not write: MLflow says so on opening
        pass


def empty_store() -> Path | None:
    """An empty store of this MLflow's schema, made once per MLflow version in the machine's cache
    (common.cache): MLflow's own tables and migrations, no experiment. None where it cannot be
    made."""
    import mlflow

    from common.cache import cache_root

    target = cache_root() / "mlflow" / f"empty-store-{mlflow.__version__}.db"
    if target.is_file():
        return target
    try:
        from mlflow.tracking import MlflowClient

        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            db = Path(tmp) / "store.db"
            MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments()  # MLflow makes its store
            whole = Path(tmp) / "whole.db"
            with contextlib.closing(sqlite3.connect(db)) as con, contextlib.closing(sqlite3.connect(whole)) as out:
                con.execute("DELETE FROM experiment_tags")  # its Default experiment: MLflow makes it
                con.execute("DELETE FROM experiments")  # again where the copy is opened
                con.commit()
                con.backup(out)  # one file: a store in WAL mode (tune_sqlite) holds its last pages in its log
                out.execute("PRAGMA journal_mode=DELETE")
            os.replace(whole, target)
    except Exception:  # noqa: BLE001 - MLflow makes each store itself, as without the cache
        return None
    return target


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
        import os

        # a tracking server that is down must not stall the sweep for minutes of retries
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
        import logging

        import mlflow
        from mlflow.tracking import MlflowClient

        # mlflow sets its own logger to INFO on import: keep database set-up chatter off the console
        logging.getLogger("mlflow").setLevel(logging.WARNING)

        self.uri = uri
        self._mlflow = mlflow
        seed_store(uri)
        self.client = MlflowClient(tracking_uri=uri)
        exp = self.client.get_experiment_by_name(experiment)
        if exp is None:
            location = (artifact_root / experiment).resolve().as_uri() if artifact_root else None
            try:
                self.experiment_id = self.client.create_experiment(
                    experiment, artifact_location=location, tags=dict([EXPERIMENT_KIND_TAG]))
            except Exception:  # noqa: BLE001 - another driver created it a moment ago
                exp = self.client.get_experiment_by_name(experiment)
                if exp is None:
                    raise
                self.experiment_id = exp.experiment_id
        else:
            self.experiment_id = exp.experiment_id
            if exp.tags.get(EXPERIMENT_KIND_TAG[0]) is None:
                self.client.set_experiment_tag(self.experiment_id, *EXPERIMENT_KIND_TAG)

    # --- the study's parent run -------------------------------------------------------
    def attach_parent(self, study: Any, *, params: Mapping[str, Any], description: str = "") -> str:
        """Reattach to the run id kept on the study, or create the parent run once. Two drivers
        starting on one study at the same moment both create one; the earliest-started parent
        run of the study wins and the other driver deletes its own."""
        from mlflow.utils.mlflow_tags import MLFLOW_RUN_NOTE

        run_id = study.user_attrs.get(A.PARENT_RUN)
        if run_id and self._reattach(run_id, description):
            return run_id
        found = self._parents(study.study_name)
        if found and self._reattach(found[0], description):
            study.set_user_attr(A.PARENT_RUN, found[0])
            return found[0]
        tags = {A.TAG_ROLE: "study", A.TAG_STUDY: study.study_name}
        if description:
            tags[MLFLOW_RUN_NOTE] = description
        mine = self.client.create_run(self.experiment_id, run_name=study.study_name, tags=tags).info.run_id
        self._log_params(mine, params)
        winner = self._parents(study.study_name)[0]
        if winner != mine:
            self.client.delete_run(mine)
        study.set_user_attr(A.PARENT_RUN, winner)
        return winner

    def _parents(self, study_name: str) -> list[str]:
        name = study_name.replace("'", "\\'")
        found = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.`{A.TAG_ROLE}` = 'study' and tags.`{A.TAG_STUDY}` = '{name}'",
            order_by=["attributes.start_time ASC", "attributes.run_id ASC"], max_results=50,
        )
        return [r.info.run_id for r in found]

    def _reattach(self, run_id: str, description: str = "") -> bool:
        from mlflow.utils.mlflow_tags import MLFLOW_RUN_NOTE

        try:
            run = self.client.get_run(run_id)
        except Exception:  # noqa: BLE001 - a parent lost from tracking is recreated
            return False
        if run.info.lifecycle_stage != "active":
            return False
        self.client.update_run(run_id, status="RUNNING")
        if description:
            self.client.set_tag(run_id, MLFLOW_RUN_NOTE, description)
        return True

    def end_parent(self, run_id: str, status: str = "FINISHED", metrics: Mapping[str, float] = {}) -> None:
        from mlflow.entities import Metric

        import time

        now = int(time.time() * 1000)
        rows = [Metric(k, float(v), now, 0) for k, v in metrics.items() if _finite(v)]
        if rows:
            self.client.log_batch(run_id, metrics=rows)
        self.client.set_terminated(run_id, status=status)

    # --- one child run per trial -------------------------------------------------------
    def start_trial(self, parent_id: str, study_name: str, number: int, params: Mapping[str, Any]) -> str:
        from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

        run = self.client.create_run(
            self.experiment_id, run_name=f"trial-{number}",
            tags={
                MLFLOW_PARENT_RUN_ID: parent_id,
                A.TAG_TRIAL: str(number),
                A.TAG_STUDY: study_name,
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
        datasets: Sequence[Mapping[str, Any]] = (),
        curve: Mapping[str, Sequence[Sequence[float]]] = {},
    ) -> str:
        """Log a finished trial's record and end its run; returns the run id. `curve`: metric
        series at the steps they were measured (val_loss during training); a final metric of the
        same name is its last point, so it is not logged again at step 0."""
        from mlflow.entities import Metric, RunTag

        import time

        now = int(time.time() * 1000)
        rows = [Metric(k, float(v), now, 0) for k, v in metrics.items() if _finite(v) and k not in curve]
        for key, values in history.items():
            rows += [Metric(key, float(v), now, i) for i, v in enumerate(values) if _finite(v)]
        for key, points in curve.items():
            rows += [Metric(key, float(v), now, int(step)) for step, v in points if _finite(v)]
        tag_rows = [RunTag(k, str(v)) for k, v in tags.items()]
        for i in range(0, max(len(rows), 1), 1000):
            self.client.log_batch(run_id, metrics=rows[i : i + 1000], tags=tag_rows if i == 0 else [])
        if datasets:
            self.log_datasets(run_id, datasets)
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
        self.log_images(run_id, {k: v for k, v in files.items() if k.startswith(SAMPLES_DIR) and k.endswith(".png")})
        self.client.set_terminated(run_id, status=status)
        return run_id

    def log_datasets(self, run_id: str, datasets: Sequence[Mapping[str, Any]]) -> None:
        """The data a trial saw, as MLflow dataset inputs (the UI's Dataset column), each with
        its context (training / validation) and content digest."""
        from mlflow.entities import Dataset, DatasetInput, InputTag

        self.client.log_inputs(run_id, datasets=[
            DatasetInput(Dataset(name=d["name"], digest=d["digest"], source_type=d["source_type"],
                                 source=d["source"], profile=json.dumps({"num_images": d.get("images")})),
                         tags=[InputTag("mlflow.data.context", d["context"])])
            for d in datasets])

    def log_images(self, run_id: str, images: Mapping[str, bytes]) -> None:
        """Sample grids as MLflow images too (the run page's image view), keyed by concept."""
        if not images:
            return
        import io

        from PIL import Image

        for name, blob in images.items():
            with Image.open(io.BytesIO(blob)) as im:
                self.client.log_image(run_id, im.convert("RGB"), key=name[:-4], step=0)

    def log_files(self, run_id: str, directory: Path, artifact_path: str) -> None:
        self.client.log_artifacts(run_id, str(directory), artifact_path=artifact_path)

    def _log_params(self, run_id: str, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, _param_str(v)) for k, v in sorted(params.items())]
        for i in range(0, len(items), 100):
            self.client.log_batch(run_id, params=items[i : i + 100])


class SafeTracker:
    """The one way csweep lives with an MLflow it may not reach: every method is a Tracker
    method that never raises. The first failure is kept in `error` (the sweep goes on; Optuna's
    storage is the source of truth and `csweep sync` back-fills MLflow later) and the method
    returns its fallback."""

    def __init__(self, uri: str, experiment: str, *, artifact_root: Path | None = None) -> None:
        from ._study import retry_on_race

        self.uri = uri
        self.tracker: Tracker | None = None
        self.error = ""
        try:
            self.tracker = retry_on_race(lambda: Tracker(uri, experiment, artifact_root=artifact_root))
        except Exception as exc:  # noqa: BLE001 - MLflow down must not stop the sweep
            self._failed(exc)

    @property
    def experiment_id(self) -> str | None:
        return self.tracker.experiment_id if self.tracker is not None else None

    def _failed(self, exc: Exception) -> None:
        self.error = self.error or f"{exc.__class__.__name__}: {str(exc)[:300]}"

    def _try(self, fallback: Any, call: Callable[[Tracker], Any]) -> Any:
        """call(tracker), or the fallback when MLflow is unreachable (the first error is kept)."""
        if self.tracker is None:
            return fallback
        try:
            return call(self.tracker)
        except Exception as exc:  # noqa: BLE001 - MLflow down must not stop the sweep
            self._failed(exc)
            return fallback

    def attach_parent(self, study: Any, *, params: Mapping[str, Any], description: str = "") -> str:
        return self._try("", lambda t: t.attach_parent(study, params=params, description=description))

    def end_parent(self, run_id: str, status: str = "FINISHED", metrics: Mapping[str, float] = {}) -> bool:
        return bool(run_id) and self._try(False, lambda t: t.end_parent(run_id, status, metrics) or True)

    def start_trial(self, parent_id: str, study_name: str, number: int, params: Mapping[str, Any]) -> str:
        return self._try("", lambda t: t.start_trial(parent_id, study_name, number, params))

    def finish_trial(self, run_id: str, **record: Any) -> bool:
        return bool(run_id) and self._try(False, lambda t: bool(t.finish_trial(run_id, **record)))

    def log_images(self, run_id: str, images: Mapping[str, bytes]) -> bool:
        return bool(run_id) and self._try(False, lambda t: t.log_images(run_id, images) or True)

    def log_files(self, run_id: str, directory: Path, artifact_path: str) -> bool:
        return bool(run_id) and self._try(False, lambda t: t.log_files(run_id, directory, artifact_path) or True)

    def end_stale(self, run_id: str, reason: str) -> bool:
        """End the run of a trial whose driver stopped (a run MLflow never saw is fine)."""
        if self.tracker is None or not run_id:
            return False
        try:
            self.tracker.client.set_terminated(run_id, status="FAILED")
            self.tracker.client.set_tag(run_id, A.FAIL_REASON, reason)
            return True
        except Exception:  # noqa: BLE001
            return False

    def find_trial_run(self, parent: str, number: int) -> str:
        """The run of trial `number` under `parent`, found by its tags ("" when none)."""
        if self.tracker is None or not parent:
            return ""
        from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

        try:
            runs = self.tracker.client.search_runs(
                [self.tracker.experiment_id], max_results=1,
                filter_string=f"tags.`{MLFLOW_PARENT_RUN_ID}` = '{parent}' and tags.`{A.TAG_TRIAL}` = '{number}'")
        except Exception:  # noqa: BLE001
            return ""
        return runs[0].info.run_id if runs else ""

    def unreachable_line(self, study_name: str, *, written: str = "") -> str:
        """The one line a command prints when MLflow could not be updated ("" when it was);
        `written` says what was kept instead (the default: the results, in the Optuna storage)."""
        if not self.error:
            return ""
        written = written or "results are in the Optuna storage"
        return (f"csweep: MLflow at {redact(self.uri)} was not updated ({self.error}); {written}, "
                f"`csweep sync {study_name}` back-fills MLflow once it is reachable")


def _param_str(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v)


def _finite(v: Any) -> bool:
    try:
        return math.isfinite(float(v))
    except (TypeError, ValueError):
        return False
