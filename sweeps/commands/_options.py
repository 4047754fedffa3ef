"""What the commands share: the one-line usage error, argparse types, the option groups that
several commands take (where the study lives; how it runs), and reading a stored study back."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, NoReturn

DEFAULT_WORKDIR = "./csweep_runs"
STORAGE_DIALECTS = ("sqlite", "postgresql", "mysql")
TRACKING_SCHEMES = ("sqlite", "postgresql", "mysql", "http", "https", "file", "databricks")


class UsageError(Exception):
    """Bad input: one line on stderr, exit status 2, nothing written."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"csweep: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def positive_int(name: str):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an int >= 1, got {text!r}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{name} must be an int >= 1, got {value}")
        return value

    return parse


def positive_float(name: str, *, zero_ok: bool = False):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got {text!r}") from None
        if value < 0 or (value == 0 and not zero_ok) or value != value:
            raise argparse.ArgumentTypeError(f"{name} must be {'>= 0' if zero_ok else '> 0'}, got {text}")
        return value

    return parse


def add_store_options(sp: argparse.ArgumentParser) -> None:
    """Where a study lives: --workdir, --storage, --tracking-uri."""
    sp.add_argument("--workdir", default=DEFAULT_WORKDIR, help="[./csweep_runs]")
    sp.add_argument("--storage", help="Optuna storage URL [sqlite:///WORKDIR/optuna.db]")
    sp.add_argument("--tracking-uri", help="MLflow tracking URI [sqlite:///WORKDIR/mlflow.db]")


def add_pool_options(sp: argparse.ArgumentParser) -> None:
    """How a stored study runs again (resume, rerun-front): --workers, --ray-address, --no-progress."""
    sp.add_argument("--workers", type=positive_int("--workers"), default=1)
    sp.add_argument("--ray-address")
    sp.add_argument("--no-progress", action="store_true")


# --- checks (cheap: no torch, no Ray, nothing written) ------------------------------------
def default_storage(workdir: Path) -> str:
    return f"sqlite:///{(workdir / 'optuna.db').resolve()}"


def default_tracking(workdir: Path) -> str:
    return f"sqlite:///{(workdir / 'mlflow.db').resolve()}"


def absolute_sqlite(url: str) -> str:
    """A sqlite URL's relative (or ~) database path made absolute against the folder the command
    runs in: what the user means by it, and what stays true in a process that runs commands from
    several folders (MLflow keeps one tracking store per URI string in a process, and the same
    relative URI from a second folder went to the first folder's database). Other URLs unchanged."""
    prefix = "sqlite:///"
    if not url.startswith(prefix):
        return url
    path, sep, query = url[len(prefix):].partition("?")
    if not path or path == ":memory:" or path.startswith("/"):
        return url
    return f"{prefix}{Path(path).expanduser().resolve()}{sep}{query}"


def artifact_root_for(tracking: str, workdir: Path) -> Path | None:
    """Artifacts beside a database-backed tracking store; a tracking server decides its own."""
    return None if tracking.startswith(("http://", "https://", "databricks")) else workdir / "mlartifacts"


def check_storage_url(url: str) -> None:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        raise UsageError(f"--storage {url!r}: not a database URL (e.g. sqlite:///optuna.db, postgresql://...)") from None
    dialect = parsed.get_backend_name()
    if dialect not in STORAGE_DIALECTS:
        raise UsageError(f"--storage {url!r}: dialect {dialect!r} is not one of {', '.join(STORAGE_DIALECTS)}")
    if dialect == "sqlite" and parsed.database and parsed.database != ":memory:":
        parent = Path(parsed.database).expanduser().resolve().parent
        if not parent.is_dir():
            raise UsageError(f"--storage {url!r}: folder {str(parent)!r} does not exist")


def check_tracking_uri(uri: str) -> None:
    scheme = uri.split(":", 1)[0].split("+", 1)[0] if "://" in uri or uri.startswith("file:") else ""
    if scheme not in TRACKING_SCHEMES:
        raise UsageError(f"--tracking-uri {uri!r}: scheme must be one of {', '.join(TRACKING_SCHEMES)}")


def check_ray_address(value: str) -> None:
    """Fail fast (no hang) when nothing answers at a cluster address."""
    import socket

    if value in ("auto", "local"):
        return
    hostport = value.split("://", 1)[-1]
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise UsageError(f"--ray-address {value!r}: must be HOST:PORT (or ray://HOST:PORT, or auto)")
    try:
        with socket.create_connection((host, int(port)), timeout=3):
            pass
    except OSError as exc:
        raise UsageError(f"--ray-address {value!r}: nothing answers at {host}:{port} ({exc.__class__.__name__}); "
                         "is the cluster up?") from None



def redacted(uri: str) -> str:
    from .._tracking import redact

    return redact(uri)


# --- a stored study ------------------------------------------------------------------------
def open_existing(a: argparse.Namespace, name: str | None = None) -> tuple[Path, str, Any]:
    """Workdir, storage URL and the loaded study of `report`/`resume`/`sync`; exit 2 if absent."""
    name = name or a.study
    workdir = Path(a.workdir).expanduser()
    storage = a.storage or default_storage(workdir)
    if a.storage:
        check_storage_url(storage)
        storage = absolute_sqlite(storage)
    elif not (workdir / "optuna.db").is_file():
        raise UsageError(f"study {name!r}: no storage at {workdir / 'optuna.db'} (wrong --workdir?)")
    from .._study import existing_directions, make_storage

    st = make_storage(storage)
    if existing_directions(st, name) is None:
        raise UsageError(f"study {name!r}: not in storage {redacted(storage)}")
    import optuna

    from .._runner import quiet

    quiet()
    return workdir, storage, optuna.load_study(study_name=name, storage=st)


def tracking_of(a: argparse.Namespace, study: Any, workdir: Path) -> str:
    """--tracking-uri, else the one the study's run used (when it held no password), else the default."""
    from common import attrs as A

    if a.tracking_uri:
        return absolute_sqlite(a.tracking_uri)
    stored = study.user_attrs.get(A.SETTINGS, {}).get("tracking_uri") or ""
    return stored if stored and "***" not in stored else default_tracking(workdir)


def stored_config(a: argparse.Namespace, study: Any, workdir: Path, storage: str, **per_invocation: Any) -> Any:
    """The study's run settings, for another run on it (resume, rerun-front)."""
    from common import attrs as A
    from .._settings import RunConfig

    stored = study.user_attrs.get(A.SETTINGS)
    if not stored or A.SPACE not in study.user_attrs:
        raise UsageError(f"study {a.study!r}: was not started by csweep run (no stored spec to run again)")
    if a.ray_address:
        check_ray_address(a.ray_address)
    tracking = tracking_of(a, study, workdir)
    stored = {"space": study.user_attrs[A.SPACE], **stored, "tracking_uri": tracking}
    return RunConfig.from_stored(
        stored, source=f"<study {a.study}>", study_name=a.study, workers=a.workers, workdir=workdir,
        storage=storage, ray_address=a.ray_address, progress=not a.no_progress,
        artifact_root=artifact_root_for(tracking, workdir), **per_invocation)


def finish(out: Any, workdir: Path, tracking_given: str | None, tracking: str) -> int:
    this_run = f"{out.completed} completed, {out.failed} failed, {out.pruned} pruned"
    if out.out_of_memory:
        this_run += f", {out.out_of_memory} out of memory"
    print(f"study {out.study_name}: this run {this_run}; the study holds {out.study_trials} trials"
          + (" (interrupted: `csweep resume " + out.study_name + "` continues)" if out.interrupted else ""))
    if out.decided:
        print(out.decided)
    print(f"reports: {out.report_dir}")
    print(f"MLflow:  csweep ui --workdir {workdir}" if tracking_given is None
          else f"MLflow:  {redacted(tracking)} (parent run {out.parent_run_id})")
    if out.aborted:
        print(f"csweep: {out.aborted}", file=sys.stderr)
        return 1
    if out.interrupted and out.signal == "SIGTERM":  # as a shell reports a process that SIGTERM ended
        print(f"csweep: terminated (SIGTERM): the trials in flight ended FAIL 'interrupted', the reports are "
              f"written; `csweep resume {out.study_name}` continues", file=sys.stderr)
        return 143
    return 130 if out.interrupted else 0

