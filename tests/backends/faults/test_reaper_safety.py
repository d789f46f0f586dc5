"""The reaper stops a job only on fresh, positive evidence, on every backend world.

- Answers that are not Airflow 3's own (a wrong base URL, a proxy's HTML 404, a 404 from the token
  endpoint, an Airflow 2 server) stop nothing and are reported, though the same evidence from a real
  Airflow 3 (the task instance and its DAG run deleted) does stop the job: the last pass shows it.
- A job whose task instance is running is never stopped by the runtime rule, however long past its
  max runtime; a job no task can be asked about is judged by its service's own clock (SageMaker
  managed spot: training time against ``MaxRuntimeInSeconds``, wall time against
  ``MaxWaitTimeInSeconds``), so a spot job waiting for capacity is left alone.

What the reaper sent to a service is read from the emulator's request log (Batch, SageMaker,
Kubernetes); the local backend has no service in between, so its job's processes are checked instead.
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from gpu_provider import names
from gpu_provider.backends.base import Backend, JobHandle, JobState
from gpu_provider.spend.prices import PriceBook
from gpu_provider.spend.reaper import KEEP, STOP, AirflowApi, ReapReport, Verdict, decide, past_service_limit, reap
from tests.backends.contract.worlds import BackendWorld, SageMakerBackendWorld, poll_one, py, wait_state
from tests.harness import pid_alive, wait_for
from tests.spend import fake_airflow_api as fake

#: a job that runs until the test ends it (its world's cleanup cancels it)
SLEEPER = py("import time; time.sleep(90)")
BOOK = PriceBook(local_gpu_hour_usd=1.0)
#: the reaper's view of time for passes that must see the job as old (a day after now)
A_DAY_LATER = 86_400.0

#: a read of each service's API (what the reaper may send on a pass that stops nothing)
_READ_PREFIXES = ("Describe", "List", "Get", "logs:")
_READ_VERBS = frozenset({"get", "list", "watch"})


def _requests_so_far(world: BackendWorld) -> int:
    emulator = getattr(world, "emulator", None)
    return 0 if emulator is None else len(emulator.requests())


def _changes_since(world: BackendWorld, mark: int) -> list[str]:
    """The requests after ``mark`` that could change something at the service (empty for the local world)."""
    emulator = getattr(world, "emulator", None)
    if emulator is None:
        return []
    actions = [str(r["action"]) for r in emulator.requests(since=mark)]
    return [a for a in actions if not (a.startswith(_READ_PREFIXES) or a.split(" ")[0].lower() in _READ_VERBS)]


def _still_running(world: BackendWorld, backend: Backend, handle: JobHandle) -> None:
    assert poll_one(backend, handle).state is JobState.RUNNING
    if world.name == "local":
        pids = backend.job_pids(handle)  # type: ignore[attr-defined]
        assert pids and all(pid_alive(pid) for pid in pids), pids


def _verdict(report: ReapReport, handle: JobHandle) -> Verdict:
    (verdict,) = [v for v in report.verdicts if v.job.handle.job_id == handle.job_id]
    return verdict


def _deleted(api: fake.FakeAirflowApi, dag_id: str) -> None:
    """The task instance, its DAG run and its DAG are gone (what a real Airflow 3 would say for them)."""
    api.tis[dag_id] = "404"
    api.runs[dag_id] = "404"
    api.dags_gone.add(dag_id)


NOT_AIRFLOW_3 = {
    # the base URL lacks the path prefix Airflow is served under: FastAPI's route 404 ({"detail": "Not Found"})
    fake.MISSING_PREFIX: "is not Airflow 3's",
    # a proxy passes /api/v2/version and /auth/token and answers every other path with its HTML 404 page
    fake.PROXY_HTML_404: "not Airflow's own 'not found'",
    # a proxy answering everything with its HTML 404 page
    fake.PROXY_HTML_ALL: "is not Airflow 3's",
    fake.TOKEN_404: "POST /auth/token answered HTTP 404",
    fake.AIRFLOW_2: "is not Airflow 3's",
    fake.AIRFLOW_2_VERSION: "not a JSON object with a 3.x 'version'",
}


def test_answers_that_are_not_airflow_3s_stop_nothing_and_are_reported(world: BackendWorld) -> None:
    backend = world.backend()
    request = world.request("reaper_guess", SLEEPER)
    dag_id = request.identity.task.dag_id
    handle = backend.submit(request)
    wait_state(backend, handle, JobState.RUNNING)

    for shape, error in NOT_AIRFLOW_3.items():
        with fake.serving(shape) as server:
            _deleted(server, dag_id)
            mark = _requests_so_far(world)
            api = AirflowApi(server.url, username="reaper", password="s3cret", timeout=10)
            report = reap(
                [world.backend()],
                api,
                dry_run=False,
                grace_period_s=0,
                book=BOOK,
                clock=lambda: time.time() + A_DAY_LATER,
            )
        verdict = _verdict(report, handle)
        assert (verdict.action, verdict.stopped) == (KEEP, False), (shape, verdict.why)
        assert any(error in e for e in report.errors), (shape, report.errors)
        assert not report.to_stop, (shape, [v.why for v in report.to_stop])
        assert _changes_since(world, mark) == [], shape
        assert "s3cret" not in " ".join(report.errors) and fake.TOKEN not in " ".join(report.errors)
    _still_running(world, backend, handle)

    # the same evidence from Airflow 3 itself does stop the job: the passes above kept it for the right reason
    with fake.serving() as server:
        _deleted(server, dag_id)
        report = reap(
            [world.backend()],
            AirflowApi(server.url, username="reaper", password="s3cret"),
            dry_run=False,
            grace_period_s=0,
            book=BOOK,
        )
        asked = server.gets()
    verdict = _verdict(report, handle)
    assert (verdict.action, verdict.stopped) == (STOP, True), (verdict.why, report.errors)
    assert "does not exist (its DAG was deleted" in verdict.why
    run_path = f"GET /api/v2/dags/{dag_id}/dagRuns/{request.identity.task.run_id}"
    assert run_path in asked, asked  # the second read, before the stop
    wait_state(backend, handle, JobState.CANCELLED)


def test_a_live_owner_keeps_its_job_past_max_runtime_and_the_services_limit_judges_an_unowned_one(
    world: BackendWorld,
) -> None:
    backend = world.backend()
    request = replace(world.request("reaper_runtime", SLEEPER), max_runtime_s=60.0)
    handle = backend.submit(request)
    wait_state(backend, handle, JobState.RUNNING)
    (owned,) = [o for o in backend.list_owned() if o.handle.job_id == handle.job_id]
    assert owned.max_runtime_s == 60.0 and owned.max_wait_s is None, owned

    with fake.serving() as server:
        server.tis[request.identity.task.dag_id] = "running"
        mark = _requests_so_far(world)
        api = AirflowApi(server.url, username="reaper", password="s3cret")
        report = reap(
            [world.backend()], api, dry_run=False, grace_period_s=0, book=BOOK, clock=lambda: time.time() + A_DAY_LATER
        )
        verdict = _verdict(report, handle)
        assert verdict.action == KEEP and "is running" in verdict.why, verdict.why
        assert _changes_since(world, mark) == []
        _still_running(world, backend, handle)

        # a job no task can be asked about (its tags name none) is judged by its service's own clock
        unowned = replace(owned, task=None)
        now = time.time()
        assert past_service_limit(unowned, now, 0) is None
        assert decide(unowned, api, now=now, grace_period_s=0)[0] == KEEP
        if owned.training_seconds is None:  # counted from the start
            later = now + A_DAY_LATER
            assert "run time since it started, past its max runtime of 60s" in str(
                past_service_limit(unowned, later, 0)
            )
            action, why = decide(unowned, api, now=later, grace_period_s=0)
            assert action == STOP and "its tags name no task instance" in why, why
        else:  # SageMaker: its own count of training time, which wall time does not move
            assert 0 <= owned.training_seconds < 60, owned
            assert past_service_limit(unowned, now + A_DAY_LATER, 0) is None
            trained = replace(unowned, training_seconds=61.0)
            assert "training time as the service counts it" in str(past_service_limit(trained, now, 0))


@pytest.mark.parametrize("world", ["sagemaker"], indirect=True)
def test_a_managed_spot_job_waiting_for_capacity_past_max_runtime_is_left_alone(world: BackendWorld) -> None:
    """The issue's case: a spot job trained, was reclaimed, and waits for capacity 1201 s after its
    creation, past MaxRuntimeInSeconds=600 but within MaxWaitTimeInSeconds=7800; its task is running."""
    assert isinstance(world, SageMakerBackendWorld)
    backend = world.backend()
    request = replace(
        world.request("reaper_spot_wait", SLEEPER, capacity=names.SPOT), max_runtime_s=600.0, capacity_wait_s=7200.0
    )
    handle = backend.submit(request)
    wait_state(backend, handle, JobState.RUNNING)
    wait_for(lambda: world.emulator.job(handle.job_id).secondary == "Training", 30, "the spot job to train")
    world.hold_capacity()
    world.restart_inside(handle)  # reclaimed: SageMaker restarts it once capacity comes back
    wait_for(
        lambda: (
            world.emulator.job(handle.job_id).secondary in ("Starting", "Interrupted")
            and mapping_restarts(world, handle) >= 1
        ),
        30,
        "the spot job to wait for capacity again",
    )
    world.emulator.backdate(handle.job_id, 1201.0)
    (owned,) = [o for o in backend.list_owned() if o.handle.job_id == handle.job_id]
    assert (owned.max_runtime_s, owned.max_wait_s) == (600, 7800), owned
    assert owned.started_at is not None and time.time() - owned.started_at > 1200  # trained 20 minutes ago
    assert owned.training_seconds is not None and owned.training_seconds < 600, owned

    with fake.serving() as server:
        server.tis[request.identity.task.dag_id] = "running"
        mark = _requests_so_far(world)
        api = AirflowApi(server.url, username="reaper", password="s3cret")
        report = reap([world.backend()], api, dry_run=False, grace_period_s=0, book=BOOK)
        verdict = _verdict(report, handle)
        assert verdict.action == KEEP and "is running" in verdict.why, verdict.why
        assert "StopTrainingJob" not in _changes_since(world, mark)
        assert world.emulator.job(handle.job_id).status == "InProgress"

        # with no task to ask, SageMaker's own limits decide: within MaxWait it waits, past MaxWait it goes
        unowned = replace(owned, task=None)
        now = time.time()
        assert past_service_limit(unowned, now, 0) is None
        assert decide(unowned, api, now=now, grace_period_s=0)[0] == KEEP
        late = owned.handle.submitted_at + 7800 + 1
        assert "past its max wait of 7800s" in str(past_service_limit(unowned, late, 0))


def mapping_restarts(world: BackendWorld, handle: JobHandle) -> int:
    """``Interrupted`` transitions of the job, as the emulator reports them."""
    return sum(1 for t in world.emulator.job(handle.job_id).transitions if t.get("Status") == "Interrupted")
