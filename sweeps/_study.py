"""The Optuna side: storage, samplers, the two-objective study."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

OBJECTIVES = ("val_loss", "peak_mem_mb")
DIRECTIONS = ("minimize", "minimize")
SAMPLERS = ("tpe", "nsga2", "gp", "random")


class StudyMismatch(ValueError):
    """An existing study under this name that csweep cannot add to."""


def make_sampler(name: str, *, seed: int | None, workers: int) -> Any:
    """A sampler by name. tpe uses the constant liar when trials run in parallel."""
    import optuna

    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, constant_liar=workers > 1, multivariate=True)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise ValueError(f"sampler {name!r} is unknown (valid: {', '.join(SAMPLERS)})")


def make_storage(url: str) -> Any:
    import optuna

    kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        kwargs["engine_kwargs"] = {"connect_args": {"timeout": 60}}
        tune_sqlite()
    return retry_on_race(lambda: optuna.storages.RDBStorage(url, **kwargs))


_SQLITE_TUNED = False


def tune_sqlite() -> None:
    """Every SQLite connection this process opens (Optuna's storage, MLflow's tracking store)
    runs in WAL mode with synchronous=NORMAL: a commit appends to the log instead of rewriting
    and syncing the database and its rollback journal, which halves the cost of Optuna's ask
    and tell, and readers (csweep report, the MLflow UI) no longer block the writer. A crash of
    the process loses nothing; a power cut can lose the last commits. SQLite's WAL needs a
    local disk: for a database shared between machines use PostgreSQL or MySQL."""
    global _SQLITE_TUNED
    if _SQLITE_TUNED:
        return
    import sqlite3

    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    def on_connect(dbapi_conn: Any, _record: Any) -> None:
        if isinstance(dbapi_conn, sqlite3.Connection):
            cur = dbapi_conn.cursor()
            try:
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute("PRAGMA synchronous=NORMAL")
            finally:
                cur.close()

    event.listen(Engine, "connect", on_connect)
    _SQLITE_TUNED = True


def retry_on_race(make: Callable[[], Any], tries: int = 4) -> Any:
    """Two drivers starting on a fresh database both create its tables; the loser of that race
    gets an integrity error and simply tries again once the winner is done."""
    import random
    import time

    from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

    for attempt in range(tries):
        try:
            return make()
        except (IntegrityError, ProgrammingError, OperationalError):
            if attempt == tries - 1:
                raise
            time.sleep(0.5 + random.random())
    raise AssertionError("unreachable")


def existing_directions(storage: Any, name: str) -> list[str] | None:
    """Directions of a stored study of that name, or None when there is none."""
    for summary in storage.get_all_studies():
        if summary.study_name == name:
            return [d.name.lower() for d in summary.directions]
    return None


def open_study(
    name: str, storage: Any, *, sampler_factory: Callable[[int], Any], create: bool = True
) -> Any:
    """Create or load a study; the sampler factory receives the number of trials already there,
    so a rerun with the same --seed continues the sequence instead of repeating it."""
    import optuna

    dirs = existing_directions(storage, name)
    if dirs is not None and dirs != list(DIRECTIONS):
        raise StudyMismatch(
            f"study {name!r} exists with directions {dirs}; csweep studies minimize {list(OBJECTIVES)}"
        )
    if dirs is None and not create:
        raise StudyMismatch(f"study {name!r} does not exist in this storage")
    n_existing = 0
    if dirs is not None:
        n_existing = len(optuna.load_study(study_name=name, storage=storage).trials)
    study = optuna.create_study(
        study_name=name, storage=storage, directions=list(DIRECTIONS),
        sampler=sampler_factory(n_existing), load_if_exists=True,
    )
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(list(OBJECTIVES))
    return study
