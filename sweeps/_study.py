"""The Optuna side: storage, samplers, the study and its objectives."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

OBJECTIVES = ("val_loss", "peak_mem_mb")  # a study's objectives unless --objectives says more
# every objective a study can have, in the order its values are stored, with its direction
KNOWN_OBJECTIVES = {"val_loss": "minimize", "peak_mem_mb": "minimize", "fidelity": "maximize"}


class StudyMismatch(ValueError):
    """An existing study under this name that csweep cannot add to."""


def directions(objectives: tuple[str, ...] | list[str] = OBJECTIVES) -> list[str]:
    return [KNOWN_OBJECTIVES[o] for o in objectives]


def parse_objectives(text: str) -> tuple[str, ...]:
    """`val_loss,peak_mem_mb[,fidelity]` in any order -> the study's objectives in their stored
    order. Raises ValueError (naming the rule) for anything else."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in KNOWN_OBJECTIVES]
    rule = "val_loss and peak_mem_mb, optionally fidelity (e.g. val_loss,peak_mem_mb,fidelity)"
    if unknown:
        raise ValueError(f"unknown objective {unknown[0]!r}; a study minimizes {rule}")
    if len(set(names)) != len(names):
        raise ValueError(f"{text!r} names an objective twice; give {rule}")
    if not set(OBJECTIVES) <= set(names):
        raise ValueError(f"{text!r} lacks {' and '.join(o for o in OBJECTIVES if o not in names)}; give {rule}")
    return tuple(o for o in KNOWN_OBJECTIVES if o in names)


def describe_objectives(objectives: tuple[str, ...] | list[str]) -> str:
    """'minimize val_loss, minimize peak_mem_mb, maximize fidelity'"""
    return ", ".join(f"{KNOWN_OBJECTIVES.get(o, 'minimize')} {o}" for o in objectives)


def mismatch(storage: Any, name: str, objectives: tuple[str, ...] | list[str]) -> str:
    """Why a stored study of that name cannot take a run with these objectives ("" when it can
    or when there is none)."""
    return _mismatch(storage, name, objectives, existing_directions(storage, name))


def _mismatch(storage: Any, name: str, objectives: tuple[str, ...] | list[str], dirs: list[str] | None) -> str:
    if dirs is None or dirs == directions(objectives):
        return ""
    import optuna

    names = optuna.load_study(study_name=name, storage=storage).metric_names
    exists = ("objectives " + ", ".join(f"{d} {n}" for n, d in zip(names, dirs))
              if names and len(names) == len(dirs) else "directions " + ", ".join(dirs))
    return (f"study {name!r} exists with {exists}; this run asks for {describe_objectives(objectives)} "
            "(--objectives): pick another --study or match its objectives")


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


def _study_id(storage: Any, name: str) -> int | None:
    """The id of the stored study of that name (one lookup by name), or None when there is none."""
    try:
        return storage.get_study_id_from_name(name)
    except KeyError:
        return None


def existing_directions(storage: Any, name: str) -> list[str] | None:
    """Directions of a stored study of that name, or None when there is none."""
    sid = _study_id(storage, name)
    return None if sid is None else [d.name.lower() for d in storage.get_study_directions(sid)]


def study_qmc_seed(storage: Any, name: str, seed: int | None) -> int:
    """The scramble seed of a study's Sobol sequence (common.attrs.QMC_SEED): the stored one,
    else --seed, else a fresh draw (so that no sampler draws its own and warns)."""
    import numpy as np

    from common import attrs as A

    sid = _study_id(storage, name)
    stored = None if sid is None else storage.get_study_user_attrs(sid).get(A.QMC_SEED)
    if stored is not None:
        return int(stored)
    return int(seed) if seed is not None else int(np.random.SeedSequence().entropy % 2**31)


def open_study(
    name: str, storage: Any, *, sampler_factory: Callable[[int], Any], create: bool = True,
    objectives: tuple[str, ...] = OBJECTIVES,
) -> Any:
    """Create or load a study; the sampler factory receives the number of trials already there,
    so a rerun with the same --seed continues the sequence instead of repeating it."""
    import optuna

    objectives = tuple(objectives)
    dirs = existing_directions(storage, name)
    why = _mismatch(storage, name, objectives, dirs)
    if why:
        raise StudyMismatch(why)
    if dirs is None and not create:
        raise StudyMismatch(f"study {name!r} does not exist in this storage")
    n_existing = 0
    if dirs is not None:
        n_existing = len(optuna.load_study(study_name=name, storage=storage).trials)
    study = optuna.create_study(
        study_name=name, storage=storage, directions=directions(objectives),
        sampler=sampler_factory(n_existing), load_if_exists=True,
    )
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(list(objectives))
    return study
