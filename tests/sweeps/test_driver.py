"""The driver's scheduling, queueing, retries, interrupts and seed replicates, against a fake
worker pool on a simulated clock: each case runs in milliseconds."""

from __future__ import annotations

import math
import threading

import optuna
import pytest
from fakes import DIE, FakeLog, FakePool, ok
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState

from common import attrs as A
from sweeps._driver import Driver
from sweeps._result import Kind, TrialResult

DISTS = {"x": FloatDistribution(0.0, 1.0)}


def study() -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(directions=["minimize", "minimize"], sampler=optuna.samplers.RandomSampler(seed=0))


def drive(pool: FakePool, *, trials: int, st: optuna.Study | None = None, **kw):
    st = st or study()
    log = FakeLog()
    driver = Driver(st, pool, log, trials=trials, **{"distributions": DISTS, **kw})
    return st, log, driver, driver.run()


def test_every_trial_is_told_and_logged_once():
    pool = FakePool(2, lambda p, n: (5.0, ok(p["x"], 10 + p["x"])))
    st, log, _, out = drive(pool, trials=7)
    assert out.completed == 7 and not out.interrupted
    assert [t.state for t in st.trials] == [TrialState.COMPLETE] * 7
    assert sorted(log.finished) == list(range(7))
    assert all(status == "FINISHED" for _, status, _ in log.finished.values())
    for t in st.trials:
        assert t.values[0] == pytest.approx(t.params["x"])
        assert t.user_attrs[A.MLFLOW_RUN_ID] == f"run-{t.number}"
        assert t.user_attrs[A.NODE_ID].startswith("node-")
        assert A.OUTCOME not in t.user_attrs and t.user_attrs[A.N_SEEDS] == 1  # ok: as the state says


def test_long_trials_are_handed_out_one_at_a_time():
    pool = FakePool(2, lambda p, n: (5.0, ok(0.1)))
    drive(pool, trials=8)
    assert pool.max_depth == 1


def test_short_trials_get_a_second_one_queued_but_never_the_last_ones():
    pool = FakePool(2, lambda p, n: (0.05, ok(0.1)))
    _, _, _, out = drive(pool, trials=20)
    assert out.completed == 20
    assert pool.max_depth == 2
    # once no more trials remain than workers, nothing is queued behind a running one
    late = [depth for started, depth in pool.depth_log if started >= 20 - pool.size]
    assert late and max(late) == 1


def test_worker_dies_with_a_trial_queued_behind_it_only_the_running_one_counts():
    # the 6th task started kills its worker; with short trials a second one sits behind it
    pool = FakePool(2, lambda p, n: (0.05, DIE if n == 6 else ok(0.1)))
    st, log, _, out = drive(pool, trials=12, max_retries=0)
    failed = [t for t in st.trials if t.state == TrialState.FAIL]
    assert len(failed) == 1 and "worker lost 1 time(s)" in failed[0].user_attrs[A.FAIL_REASON]
    assert out.completed == 11 and out.failed == 1
    assert pool.replaced and pool.max_depth == 2
    assert len(log.finished) == 12 and log.finished[failed[0].number][1] == "FAILED"
    assert not any(A.ATTEMPTS in t.user_attrs for t in st.trials)


def test_a_trial_whose_worker_dies_is_retried_on_a_fresh_worker():
    pool = FakePool(1, lambda p, n: (1.0, DIE if n == 2 else ok(0.1)))
    st, _, _, out = drive(pool, trials=3, max_retries=1)
    assert out.completed == 3 and pool.replaced == [0]
    assert [t.user_attrs.get(A.ATTEMPTS) for t in st.trials] == [None, 2, None]


def test_retries_exhausted_fails_that_trial_and_the_sweep_goes_on():
    pool = FakePool(1, lambda p, n: (1.0, DIE if p["x"] > 0.5 else ok(0.1)))
    st, _, _, out = drive(pool, trials=6, max_retries=2, max_fail_share=1.0)
    bad = [t for t in st.trials if t.params["x"] > 0.5]
    assert bad and all(t.state == TrialState.FAIL for t in bad)
    assert all("worker lost 3 time(s)" in t.user_attrs[A.FAIL_REASON] for t in bad)
    assert out.completed == 6 - len(bad)


def test_ctrl_c_between_ask_and_tell_leaves_no_trial_running():
    stop = threading.Event()

    def on_submit(pool, params):
        if len(pool.started_params) >= 3:
            stop.set()  # lands after an ask and its submit, before that trial is told

    pool = FakePool(2, lambda p, n: (0.05, ok(0.1)), on_submit=on_submit)
    st, log, _, out = drive(pool, trials=10, stop=stop)
    assert out.interrupted
    states = [t.state for t in st.trials]
    assert TrialState.RUNNING not in states
    cut = [t for t in st.trials if t.state == TrialState.FAIL]
    assert cut and all(t.user_attrs[A.REPLACED] and "interrupted" in t.user_attrs[A.FAIL_REASON] for t in cut)
    assert all(log.finished[t.number][1] == "KILLED" for t in cut)
    assert len(st.trials) < 10


def test_out_of_memory_is_a_failed_trial_without_numbers():
    def behave(p, n):
        if p["x"] > 0.7:
            return 1.0, TrialResult(Kind.OUT_OF_MEMORY, reason="OutOfMemoryError: planted")
        return 1.0, ok(p["x"])

    pool = FakePool(2, behave)
    st, log, _, out = drive(pool, trials=12)
    oom = [t for t in st.trials if t.params["x"] > 0.7]
    assert oom and out.out_of_memory == len(oom) and out.failed == 0
    for t in oom:
        assert t.state == TrialState.FAIL and t.values is None
        assert t.user_attrs[A.OUT_OF_MEMORY] is True and t.user_attrs[A.OUTCOME] == "out_of_memory"
        assert t.user_attrs[A.FAIL_REASON].startswith("out of memory")
        assert log.finished[t.number][2]["tags"]["infeasible"] == "out of memory"


def test_a_sweep_whose_trials_keep_failing_stops():
    pool = FakePool(1, lambda p, n: (1.0, TrialResult.failed("RuntimeError: boom")))
    _, _, _, out = drive(pool, trials=20)
    assert out.aborted.startswith("stopped: 4 of 4 trials failed") and out.done == 4


def test_seed_replicates_run_in_parallel_and_combine_into_one_trial():
    pool = FakePool(3, lambda p, n: (2.0, ok(1.0 + 0.1 * p["seed"], 10.0 + p["seed"])))
    st, log, _, out = drive(pool, trials=2, seeds=3, fixed={"seed": 5})
    assert out.completed == 2 and len(st.trials) == 2
    assert pool.clock == pytest.approx(4.0)  # three replicates at once on three workers: 2 s per config
    for t in st.trials:
        assert t.user_attrs[A.SEEDS] == [5, 6, 7] and t.user_attrs[A.N_SEEDS] == 3
        assert t.values[0] == pytest.approx(1.6)  # mean of 1.5, 1.6, 1.7
        assert t.values[1] == pytest.approx(17.0)  # the max
        assert t.user_attrs[A.VAL_LOSS_STD] == pytest.approx(0.1)
        assert t.user_attrs[A.VAL_LOSS_SEM] == pytest.approx(0.1 / math.sqrt(3))
        assert t.user_attrs[A.VAL_LOSS_REPLICATES] == pytest.approx([1.5, 1.6, 1.7])
        _, _, record = log.finished[t.number]
        assert record["history"]["replicate_val_loss"] == pytest.approx([1.5, 1.6, 1.7])
        assert record["tags"]["seeds"] == "5,6,7"
    assert sorted(p["seed"] for p in pool.started_params) == [5, 5, 6, 6, 7, 7]


def test_one_bad_replicate_makes_the_config_bad():
    pool = FakePool(2, lambda p, n: (1.0, TrialResult(Kind.OUT_OF_MEMORY, reason="oom") if p["seed"] == 1
                                     else ok(0.5)))
    st, _, _, out = drive(pool, trials=2, seeds=2)
    assert out.out_of_memory == 2
    assert all(t.user_attrs[A.FAIL_REASON].startswith("out of memory: seed 1") for t in st.trials)


def test_a_study_may_mix_seed_counts():
    st = study()
    drive(FakePool(2, lambda p, n: (1.0, ok(0.5))), trials=3, st=st)
    drive(FakePool(2, lambda p, n: (1.0, ok(0.5 + 0.01 * p["seed"]))), trials=2, st=st, seeds=2)
    assert [t.user_attrs.get(A.N_SEEDS, 1) for t in st.trials] == [1, 1, 1, 2, 2]
    assert [A.VAL_LOSS_STD in t.user_attrs for t in st.trials] == [False] * 3 + [True] * 2


def test_plain_runs_give_the_objective_its_seed():
    pool = FakePool(1, lambda p, n: (1.0, ok(0.5)))
    drive(pool, trials=2, fixed={"seed": 11})
    assert [p["seed"] for p in pool.started_params] == [11, 11]


def test_the_same_seed_samples_the_same_sequence_and_a_rerun_new_points():
    """`--seed K` on a fresh study samples the same sequence; a rerun on it seeds K + trials."""
    from sweeps._samplers import make_sampler
    from sweeps._study import open_study

    def sweep(storage, n_runs=1):
        for _ in range(n_runs):
            st = open_study("s", storage, sampler_factory=lambda n: make_sampler("tpe", seed=11 + n, workers=1))
            drive(FakePool(1, lambda p, n: (1.0, ok((p["x"] - 0.3) ** 2))), trials=12, st=st)
        return [t.params["x"] for t in st.trials]

    first, second = sweep(optuna.storages.InMemoryStorage()), sweep(optuna.storages.InMemoryStorage())
    assert first == second and len(set(first)) == 12
    twice = sweep(optuna.storages.InMemoryStorage(), n_runs=2)
    assert twice[:12] == first and not set(twice[12:]) & set(first)


# --- a third objective: fidelity, maximized ------------------------------------------------
def three_objective_study() -> optuna.Study:
    from sweeps._study import open_study

    return open_study("s", optuna.storages.InMemoryStorage(), objectives=("val_loss", "peak_mem_mb", "fidelity"),
                      sampler_factory=lambda n: optuna.samplers.RandomSampler(seed=n))


def scored(val_loss: float, fidelity: float | None, mem: float = 10.0) -> TrialResult:
    r = ok(val_loss, mem)
    if fidelity is not None:
        r.metrics["fidelity"] = fidelity
    return r


def test_fidelity_as_a_third_objective_is_told_maximized():
    st = three_objective_study()
    assert [d.name for d in st.directions] == ["MINIMIZE", "MINIMIZE", "MAXIMIZE"]
    assert st.metric_names == ["val_loss", "peak_mem_mb", "fidelity"]
    pool = FakePool(2, lambda p, n: (1.0, scored(p["x"], 1 - p["x"], 10 + n)))
    _, log, _, out = drive(pool, trials=5, st=st, objectives=("val_loss", "peak_mem_mb", "fidelity"))
    assert out.completed == 5
    for t in st.trials:
        assert t.values[0] == pytest.approx(t.params["x"]) and t.values[2] == pytest.approx(1 - t.params["x"])
        assert log.finished[t.number][2]["metrics"]["fidelity"] == pytest.approx(1 - t.params["x"])


def test_a_result_without_the_third_objective_is_a_failed_trial_that_says_so():
    st = three_objective_study()
    pool = FakePool(1, lambda p, n: (1.0, scored(0.5, None if n == 2 else float("nan") if n == 3 else 0.4)))
    _, log, _, out = drive(pool, trials=4, st=st, objectives=("val_loss", "peak_mem_mb", "fidelity"))
    assert out.completed == 2 and out.failed == 2
    states = [t.state for t in st.trials]
    assert states == [TrialState.COMPLETE, TrialState.FAIL, TrialState.FAIL, TrialState.COMPLETE]
    assert st.trials[1].user_attrs[A.FAIL_REASON] == "the study's objective fidelity has no finite value (absent)"
    assert st.trials[2].user_attrs[A.FAIL_REASON] == "the study's objective fidelity has no finite value (fidelity=nan)"
    assert log.finished[1][1] == "FAILED" and "fidelity" in log.finished[1][2]["tags"]["fail_reason"]


def test_seed_replicates_measure_the_noise_of_fidelity_too():
    pool = FakePool(3, lambda p, n: (1.0, scored(0.5, 0.2 + 0.1 * p["seed"])))
    st, log, _, _ = drive(pool, trials=1, seeds=3, fixed={"seed": 0})
    t = st.trials[0]
    assert t.user_attrs[A.FIDELITY] == pytest.approx(0.3)  # the mean of 0.2, 0.3, 0.4
    assert t.user_attrs[A.FIDELITY_STD] == pytest.approx(0.1)
    assert t.user_attrs[A.FIDELITY_SEM] == pytest.approx(0.1 / math.sqrt(3))
    assert t.user_attrs[A.FIDELITY_REPLICATES] == pytest.approx([0.2, 0.3, 0.4])
    assert log.finished[0][2]["history"]["replicate_fidelity"] == pytest.approx([0.2, 0.3, 0.4])


def test_enqueued_configs_run_first_and_carry_their_attrs():
    """rerun-front's path: the front's configs are enqueued, each naming the trial it re-trains."""
    pool = FakePool(2, lambda p, n: (1.0, ok(p["x"])))
    st, _, _, out = drive(pool, trials=3, enqueue=[{"x": 0.25}, {"x": 0.75}],
                          enqueue_attrs=[{A.RERUN_OF: 7}, {A.RERUN_OF: 9}])
    assert out.completed == 3
    assert [t.params["x"] for t in st.trials[:2]] == [0.25, 0.75]
    assert [t.user_attrs.get(A.RERUN_OF) for t in st.trials] == [7, 9, None]


def test_the_progress_counts_the_replicates_running_not_the_configs():
    """--workers 2 --seeds 2: both workers busy with one config's two replicates reads running=2."""
    seen = []
    pool = FakePool(2, lambda p, n: (1.0, ok(p["x"])))
    drive(pool, trials=3, seeds=2, on_progress=lambda o, flight: seen.append(dict(flight)))
    assert len(seen) == 3
    assert seen[0] == {"running": 2, "queued": 0, "configs": 1}  # the second config's replicates
    assert seen[-1] == {"running": 0, "queued": 0, "configs": 0}
    # as the bar words it: runs of configs, not a bare configs=1 that reads as "one config in all"
    from sweeps._runner import in_flight_text

    assert in_flight_text(seen[0], 2) == {"running": "2 runs of 1 config"}
    assert in_flight_text({"running": 4, "queued": 0, "configs": 2}, 2) == {"running": "4 runs of 2 configs"}
    assert in_flight_text({"running": 3, "queued": 1, "configs": 3}, 1) == {"running": 3}


def _stored_space_study(names):
    from optuna.storages import InMemoryStorage

    st = optuna.create_study(storage=InMemoryStorage(), directions=["minimize", "minimize"],
                             sampler=optuna.samplers.RandomSampler(seed=0))
    st.set_user_attr(A.SPACE, {"params": {n: {"type": "float", "low": 0.0, "high": 1.0} for n in names}})
    st.set_user_attr(A.TARGET_TRIALS, 4)
    return st


def test_a_resume_requeues_a_stale_trial_only_when_its_parameters_are_complete():
    """A driver killed while `ask` wrote a trial's parameters leaves it RUNNING with some of them:
    the resume fails it and samples that slot afresh; a whole stale config is run again as it was."""
    from optuna.distributions import FloatDistribution as F

    from sweeps._resume import prepare_resume

    st = _stored_space_study(["x", "y"])
    dists = {"x": F(0.0, 1.0), "y": F(0.0, 1.0)}
    done = st.ask(dists)
    st.tell(done, [0.1, 1.0])
    whole = st.ask(dists)  # stale, with both parameters
    partial = st.ask({"x": F(0.0, 1.0)})  # stale, `y` never written
    redo, remaining, attrs = prepare_resume(st, None)
    assert attrs == [{}]
    assert redo == [whole.params]
    assert remaining == 3  # 4 wanted, 1 done: the partial one's slot is sampled afresh
    assert {t.number: t.state for t in st.trials} == {0: TrialState.COMPLETE, 1: TrialState.FAIL,
                                                       2: TrialState.FAIL}
    # the resumed run: the whole config first, then fresh ones; every trial has both parameters
    pool = FakePool(2, lambda p, n: (1.0, ok(p["x"])))
    drive(pool, trials=remaining, st=st, enqueue=redo, distributions=dists)
    fresh = [t for t in st.trials if t.number > partial.number]
    assert fresh[0].params == whole.params
    assert all(set(t.params) == {"x", "y"} for t in fresh) and len(fresh) == 3
