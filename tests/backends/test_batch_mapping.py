"""The Batch backend's pure parts: the state table, failure reasons, parse-time refusals, request bodies.

Nothing here talks to a server; tests/backends/test_batch_backend.py runs the backend against the emulator.
"""

from __future__ import annotations

import json

import pytest

from gpu_provider import GpuResources, names
from gpu_provider.backends.base import JobIdentity, JobRequest, JobState, TaskKey, resolve_backend
from gpu_provider.backends.batch import (
    CANCEL_PREFIX,
    MULTI_NODE_ENTRY,
    STATE_TABLE,
    BatchBackend,
    console_log_url,
    refine_failure,
)
from gpu_provider.backends.batch.mapping import RUNNABLE_REASONS, runnable_verdict, unrunnable
from gpu_provider.backends.common import END_OF_LOG_COMMAND

# how Batch words the reason of a job its queue's jobStateTimeLimitActions cancelled (AWS Batch user guide)
QUEUE_ACTION = "Terminated by JobStateTimeLimit action due to reason: "
QUEUES = {"spot_queue": "gpu-spot", "on_demand_queue": "gpu-on-demand"}


def _request(nodes: int = 1, gpus: float = 1, capacity: str = "on-demand", **kwargs: object) -> JobRequest:
    identity = JobIdentity(
        task=TaskKey("dag", "train", "manual__2026", -1), try_number=1, attempt=1, capacity=capacity, team="ml-infra"
    )
    return JobRequest(
        identity=identity,
        command=("python", "train.py"),
        env={"GPU_PROVIDER_ATTEMPT": "1", "TOKEN_NAME": "x"},
        resources=GpuResources(gpus=gpus, nodes=nodes, cpu=8, memory="30Gi"),
        capacity=capacity,
        image="123.dkr.ecr.us-east-1.amazonaws.com/train:1",
        **kwargs,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("remote", "state"),
    [
        ("SUBMITTED", JobState.QUEUED),
        ("PENDING", JobState.QUEUED),
        ("RUNNABLE", JobState.QUEUED),
        ("STARTING", JobState.STARTING),
        ("RUNNING", JobState.RUNNING),
        ("SUCCEEDED", JobState.SUCCEEDED),
        ("FAILED", JobState.FAILED),
    ],
)
def test_state_table_covers_every_batch_state(remote: str, state: JobState) -> None:
    assert STATE_TABLE[remote] is state


@pytest.mark.parametrize(
    ("job", "state", "reason", "interruption"),
    [
        ({"statusReason": "Host EC2 (instance i-0abc123) terminated."}, JobState.PREEMPTED, "Host EC2", "preempted"),
        (
            {
                "statusReason": "Essential container in task exited",
                "attempts": [{"statusReason": "Host EC2 (instance i-1) terminated."}],
            },
            JobState.PREEMPTED,
            "Host EC2 (instance i-1)",
            "preempted",
        ),
        ({"statusReason": "Your Spot Instance was interrupted"}, JobState.PREEMPTED, "Spot Instance", "preempted"),
        (
            {"statusReason": CANCEL_PREFIX + "Airflow task d.t was killed"},
            JobState.CANCELLED,
            "Airflow task d.t was killed",
            None,
        ),
        # our own capacity-timeout cancel, found later by a lookup: an interruption, not a kill
        (
            {"statusReason": CANCEL_PREFIX + names.CAPACITY_TIMEOUT_MARK + "no spot capacity after 600s"},
            JobState.CANCELLED,
            "no spot capacity after 600s",
            "capacity_timeout",
        ),
        # a job that could never start, terminated by this provider: the job's failure, not a cancel
        (
            {"statusReason": CANCEL_PREFIX + "cannot run: MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT - too big"},
            JobState.FAILED,
            "AWS Batch cannot run this job: MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT - too big",
            None,
        ),
        # the queue's jobStateTimeLimitActions gave up waiting for capacity
        (
            {"statusReason": QUEUE_ACTION + "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY"},
            JobState.CANCELLED,
            "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY",
            "capacity_timeout",
        ),
        (
            {"statusReason": QUEUE_ACTION + "MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT"},
            JobState.FAILED,
            "MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT",
            None,
        ),
        (
            {"statusReason": "Essential container in task exited", "attempts": [{"container": {"exitCode": 3}}]},
            JobState.FAILED,
            "Essential container in task exited",
            None,
        ),
        ({"statusReason": "Job attempt duration exceeded timeout"}, JobState.FAILED, "max_runtime", None),
        ({}, JobState.FAILED, "no reason given", None),
        # a person terminating the job in the console is the job's end, not an interruption
        ({"statusReason": "Terminated by operator"}, JobState.FAILED, "Terminated by operator", None),
    ],
)
def test_failed_jobs_are_read_for_preemption_and_cancel(
    job: dict, state: JobState, reason: str, interruption: str | None
) -> None:
    got_state, got_reason, got_interruption = refine_failure(job)
    assert got_state is state
    assert reason in got_reason
    assert got_interruption == interruption
    if interruption is not None:
        assert interruption in names.INTERRUPTION_KINDS


def _validate(
    backend: object = None,
    *,
    resources: GpuResources | None = None,
    capacity: str = "on-demand",
    multi_capacity: bool = False,
    priority: int | None = None,
    max_runtime_s: float | None = None,
    image: str | None = "img",
) -> None:
    """What the operator does at parse time: resolve the backend, validate the spec and the image."""
    resolved = resolve_backend(backend or {"name": "batch", **QUEUES})
    resolved.validate(
        resources or GpuResources(),
        capacity,
        multi_capacity=multi_capacity,
        priority=priority,
        max_runtime_s=max_runtime_s,
    )
    resolved.validate_image(image)


def test_multi_node_on_spot_is_refused_at_parse_time_with_what_to_use_instead() -> None:
    with pytest.raises(ValueError, match=r"resources.nodes=2 with spot capacity.*capacity='on_demand'"):
        _validate(resources=GpuResources(gpus=8, nodes=2), capacity="spot", multi_capacity=True)
    with pytest.raises(ValueError, match=r"resources.nodes=2 with spot capacity"):
        _validate(resources=GpuResources(gpus=8, nodes=2), capacity="on-demand", multi_capacity=True)
    _validate(resources=GpuResources(gpus=8, nodes=2), capacity="on-demand")  # on-demand multi-node is fine


def test_capabilities_declare_what_batch_cannot_run() -> None:
    caps = BatchBackend.capabilities
    assert (caps.multi_node_spot, caps.fractional_gpus, caps.instance_types) == (False, False, False)
    assert (caps.image_required, caps.unique_names) == (True, False)
    assert (caps.priority_range, caps.min_runtime_s) == ((0, 9999), 60)
    assert BatchBackend.service == "AWS Batch"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"capacity": "spot", "backend": {"name": "batch", "on_demand_queue": "q"}}, "no spot_queue"),
        ({"backend": {"name": "batch", "spot_queue": "q"}}, "no on_demand_queue"),
        ({"image": None}, "image=None"),
        ({"resources": GpuResources(gpus=0.5)}, r"resources.gpus=0.5.*whole GPUs"),
        ({"resources": GpuResources(instance_types=("g5.xlarge",))}, r"instance_types=\['g5.xlarge'\]"),
        ({"priority": 10000}, r"priority=10000.*0 to 9999"),
        ({"max_runtime_s": 30}, r"max_runtime=30s.*60s"),
        ({"backend": {"name": "batch", **QUEUES, "master_port": "http"}}, "master_port='http'"),
        ({"backend": {"name": "batch", **QUEUES, "secrets": {"HF_TOKEN": "hf_abcdef"}}}, "must be the ARN"),
        ({"backend": {"name": "batch", **QUEUES, "share_identifier": "ml-infra"}}, "share_identifier='ml-infra'"),
        ({"backend": {"name": "batch", **QUEUES, "queue": "x"}}, "unknown option"),
        # a team maps to a share identifier: keys are team names, values Batch share identifiers
        (
            {"backend": {"name": "batch", **QUEUES, "share_identifiers": {"TeamA": "teamA"}}},
            r"share_identifiers key 'TeamA' is not a team name",
        ),
        (
            {"backend": {"name": "batch", **QUEUES, "share_identifiers": {"team-a": "team-A"}}},
            r"share_identifiers\['team-a'\]='team-A' must be 1-255 letters, digits or underscores",
        ),
        ({"backend": {"name": "batch", **QUEUES, "share_identifiers": "{team-a"}}, "share_identifiers must be"),
        ({"backend": {"name": "batch", **QUEUES, "share_identifiers": '["teamA"]'}}, "share_identifiers must be"),
    ],
)
def test_bad_batch_input_is_refused_at_parse_time(kwargs: dict, match: str) -> None:
    with pytest.raises((ValueError, TypeError), match=match) as err:
        _validate(**kwargs)
    assert "hf_abcdef" not in str(err.value), "a secret value must never be echoed"


def test_queues_and_options_come_from_the_config_section(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__BATCH_SPOT_QUEUE", "cfg-spot")
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__BATCH_ON_DEMAND_QUEUE", "cfg-od")
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__BATCH_LOG_GROUP", "/gpu/jobs")
    backend = resolve_backend("batch")
    assert isinstance(backend, BatchBackend)
    assert (backend.spot_queue, backend.on_demand_queue, backend.log_group) == ("cfg-spot", "cfg-od", "/gpu/jobs")
    # an explicit option wins; the spec round-trips through JSON (it travels to the triggerer)
    explicit = resolve_backend({"name": "batch", "spot_queue": "mine"})
    assert explicit.options()["spot_queue"] == "mine"
    assert resolve_backend(json.loads(json.dumps(explicit.spec()))) == explicit


def test_job_definition_is_named_by_its_content_and_holds_resources() -> None:
    backend = BatchBackend(**QUEUES, job_role_arn="arn:aws:iam::1:role/job")
    body = backend.job_definition(_request())
    again = backend.job_definition(_request())
    assert body == again
    assert body["jobDefinitionName"].startswith("gp-dag-train-")
    container = body["containerProperties"]
    assert container["resourceRequirements"] == [
        {"type": "GPU", "value": "1"},
        {"type": "VCPU", "value": "8"},
        {"type": "MEMORY", "value": str(30 * 1024)},
    ]
    assert container["jobRoleArn"] == "arn:aws:iam::1:role/job"
    assert "environment" not in container, "per-attempt values travel as overrides"
    changed = backend.job_definition(_request(gpus=2))
    assert changed["jobDefinitionName"] != body["jobDefinitionName"]


def test_multi_node_definition_wraps_the_command_for_rendezvous() -> None:
    body = BatchBackend(**QUEUES).job_definition(_request(nodes=4, gpus=8))
    assert body["type"] == "multinode"
    props = body["nodeProperties"]
    assert (props["numNodes"], props["mainNode"]) == (4, 0)
    (node_range,) = props["nodeRangeProperties"]
    assert node_range["targetNodes"] == "0:"
    assert node_range["container"]["command"] == [
        "/bin/sh",
        "-c",
        MULTI_NODE_ENTRY,
        "gpu-provider-entry",
        *END_OF_LOG_COMMAND,  # marks the end of each node's log
        "python",
        "train.py",
    ]
    plain = BatchBackend(**QUEUES, multi_node_entry=False).job_definition(_request(nodes=4, gpus=8))
    assert plain["nodeProperties"]["nodeRangeProperties"][0]["container"]["command"] == ["python", "train.py"]


def test_console_links_use_the_consoles_encoding() -> None:
    url = console_log_url("eu-west-1", "/aws/batch/job", "gp-def/default/abc123")
    assert url == (
        "https://eu-west-1.console.aws.amazon.com/cloudwatch/home?region=eu-west-1#logsV2:log-groups/log-group/"
        "$252Faws$252Fbatch$252Fjob/log-events/gp-def$252Fdefault$252Fabc123"
    )
    assert console_log_url("eu-west-1", "/aws/batch/job", stream_prefix="gp-def/").endswith(
        "$252Faws$252Fbatch$252Fjob$3FlogStreamNameFilter$3Dgp-def$252F"
    )


def test_share_identifiers_come_from_the_option_or_the_config_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = resolve_backend({"name": "batch", **QUEUES, "share_identifiers": '{"team-a": "teamA"}'})
    assert isinstance(backend, BatchBackend)
    assert backend.share_identifiers == {"team-a": "teamA"}
    assert resolve_backend(json.loads(json.dumps(backend.spec()))) == backend  # travels to the triggerer
    config = '{"vision": "VisionTeam", "ml-infra": "infra"}'
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__BATCH_SHARE_IDENTIFIERS", config)
    configured = BatchBackend(**QUEUES)
    assert configured.share_identifiers == {"vision": "VisionTeam", "ml-infra": "infra"}
    assert BatchBackend(**QUEUES, share_identifiers={"nlp": "NLP"}).share_identifiers == {"nlp": "NLP"}
    monkeypatch.setenv("AIRFLOW__GPU_PROVIDER__BATCH_SHARE_IDENTIFIERS", "vision=VisionTeam")
    with pytest.raises(ValueError, match=r"\[gpu_provider\] batch_share_identifiers must be"):
        BatchBackend(**QUEUES)


# Batch's RUNNABLE status reasons ("Jobs stuck in a RUNNABLE status", AWS Batch user guide): each row of the
# table, worded as Batch words it, and what the job's owner does with it
RUNNABLE_CASES = {
    "MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT": (
        "MISCONFIGURATION:JOB_RESOURCE_REQUIREMENT - The job resource requirement (vCPU/memory/GPU) is higher than "
        "that can be met by the CE(s) attached to the job queue.",
        "fatal",
    ),
    "MISCONFIGURATION:COMPUTE_ENVIRONMENT_MAX_RESOURCE": (
        "MISCONFIGURATION:COMPUTE_ENVIRONMENT_MAX_RESOURCE - CE(s) associated with the job queue cannot meet the "
        "CPU requirement of the job.",
        "wait",
    ),
    "MISCONFIGURATION:SERVICE_ROLE_PERMISSIONS": (
        "MISCONFIGURATION:SERVICE_ROLE_PERMISSIONS - Batch service role has a permission issue.",
        "wait",
    ),
    "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY": (
        "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY - Service cannot fulfill the capacity requested for instance type "
        "[p4d.24xlarge]",
        "wait",
    ),
    "CAPACITY:": ("CAPACITY:A_REASON_BATCH_MAY_ADD - spot capacity", "wait"),
    "MISCONFIGURATION:": ("MISCONFIGURATION:A_REASON_BATCH_MAY_ADD - something", "wait"),
}


def test_every_runnable_reason_of_the_table_has_a_case() -> None:
    assert set(RUNNABLE_CASES) == {prefix for prefix, _ in RUNNABLE_REASONS}
    assert dict(RUNNABLE_REASONS) == {prefix: verdict for prefix, (_, verdict) in RUNNABLE_CASES.items()}


@pytest.mark.parametrize("prefix", list(RUNNABLE_CASES))
def test_a_runnable_reason_is_fatal_only_when_the_job_can_never_start_as_submitted(prefix: str) -> None:
    reason, verdict = RUNNABLE_CASES[prefix]
    assert runnable_verdict(reason) == verdict
    job = {"status": "RUNNABLE", "statusReason": reason}
    assert unrunnable(job) == (reason if verdict == "fatal" else None)
    # the same words on a job that is not RUNNABLE (or no words) never make it unrunnable
    assert unrunnable({"status": "RUNNING", "statusReason": reason}) is None


def test_an_unknown_runnable_reason_waits() -> None:
    assert runnable_verdict("") == "wait"
    assert runnable_verdict("SOMETHING_NEW - Batch said") == "wait"
    assert unrunnable({"status": "RUNNABLE"}) is None
