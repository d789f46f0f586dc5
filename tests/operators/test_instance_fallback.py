"""Ordered instance-type fallback end to end, on each backend: a task whose first two instance types get no
capacity runs on the third. Real Airflow (dag.test in a child process) against the emulators, each with a
per-type capacity knob; the XCom shows the instance type (and its price) of every attempt."""

from __future__ import annotations

from typing import Any

from tests.batch_world import BatchWorld
from tests.harness import Harness
from tests.kubernetes_world import KubernetesWorld
from tests.sagemaker_world import CHECKPOINT_BUCKET, SageMakerWorld

TYPES = ("p5.48xlarge", "p4d.24xlarge", "g6e.48xlarge")


def _operator(backend: str, command: str, capacity: str, checkpoint: str, gpus: int = 1) -> str:
    return f"""
        from gpu_provider import InstanceFallback
        GpuJobOperator(
            task_id="job",
            backend={backend},
            image="trainer:1",
            command={command},
            resources=GpuResources(gpus={gpus}, instance_types={TYPES!r}),
            capacity={capacity},
            checkpoint="{checkpoint}",
            deferrable=True,
            poll_interval=0.3,
        )
        """


def _attempts(run: Any) -> list[dict[str, Any]]:
    task = run.task()
    assert task["state"] == "success", run.log[-4000:]
    return list(task["xcom"]["attempts"])


def _held_then_ran(attempts: list[dict[str, Any]], capacity: str, *, priced: bool = True) -> None:
    """The first two attempts gave their type up for want of capacity; the third ran on the third type."""
    assert [(a["instance_choice"], a["instance_type"]) for a in attempts] == [(t, t) for t in TYPES] or [
        (a["instance_choice"], a["instance_type"]) for a in attempts
    ] == [(t, "ml." + t) for t in TYPES], attempts
    assert [(a["capacity"], a["state"], a["interruption"]) for a in attempts] == [
        (capacity, "CANCELLED", "capacity_timeout"),
        (capacity, "CANCELLED", "capacity_timeout"),
        (capacity, "SUCCEEDED", None),
    ]
    ran = attempts[-1]
    if not priced:  # the local backend charges [gpu_provider] local_gpu_hour_usd, whatever the type
        return
    # the cost is of the type that ran
    assert ran["price"]["instance_type"].removeprefix("ml.") == "g6e.48xlarge", ran["price"]
    assert ran["cost_usd"] is not None


def test_sagemaker_runs_on_the_third_instance_type_when_the_first_two_have_no_capacity(
    harness: Harness, sagemaker: SageMakerWorld
) -> None:
    for held in TYPES[:2]:
        sagemaker.emulator.hold("*", instance_type="ml." + held)
    dag = harness.write_dag(
        "sm_instance_fallback",
        _operator(
            sagemaker.backend_source(),
            harness.toy_command(str(harness.tmp / "out"), 2, 0.05),
            "OnDemand(instances=InstanceFallback(capacity_wait=2), backoff=0)",
            f"s3://{CHECKPOINT_BUCKET}/sm_instance_fallback",
        ),
    )
    attempts = _attempts(harness.run(dag, "sm_instance_fallback"))
    _held_then_ran(attempts, "on-demand")
    bodies = sagemaker.bodies("CreateTrainingJob")
    assert [b["ResourceConfig"]["InstanceType"] for b in bodies] == ["ml." + t for t in TYPES]
    assert len(sagemaker.bodies("StopTrainingJob")) == 2  # each held type given up after its own wait


def test_kubernetes_tries_every_type_on_spot_then_on_demand_and_runs_on_the_third(
    harness: Harness, kubernetes: KubernetesWorld
) -> None:
    kubernetes.emulator.set_shortage("spot")  # no spot node of any type
    for held in TYPES[:2]:
        kubernetes.emulator.set_shortage("*", instance_type=held)  # nor any node of the first two types
    dag = harness.write_dag(
        "k8s_instance_fallback",
        _operator(
            '{"name": "kubernetes"}',
            harness.toy_command(str(harness.tmp / "out"), 2, 0.05),
            "SpotFallback(spot_wait_timeout=1.5, instances=InstanceFallback(capacity_wait=1.5), "
            "max_interruptions=5, backoff=0)",
            f"file://{harness.tmp / 'ckpt'}",
        ),
    )
    attempts = _attempts(harness.run(dag, "k8s_instance_fallback"))
    assert [(a["capacity"], a["instance_choice"]) for a in attempts] == [
        ("spot", TYPES[0]),
        ("spot", TYPES[1]),
        ("spot", TYPES[2]),
        ("on-demand", TYPES[0]),
        ("on-demand", TYPES[1]),
        ("on-demand", TYPES[2]),
    ]
    _held_then_ran(attempts[3:], "on-demand")
    assert {a["interruption"] for a in attempts[:3]} == {"capacity_timeout"}
    # what reached the API server: each pod's node affinity names the one type of its attempt
    pods = [b for b in kubernetes.bodies("create pods")] or [b for b in kubernetes.bodies("create jobs")]
    wanted = [_affinity_types(b) for b in pods]
    assert wanted == [[t] for t in TYPES] * 2, wanted


def _affinity_types(body: dict[str, Any]) -> list[str]:
    spec = body["spec"]
    spec = spec.get("template", {}).get("spec", spec)
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return [v for term in terms for e in term["matchExpressions"] for v in e["values"]]


def test_batch_submits_each_type_to_its_queue_and_runs_on_the_third(harness: Harness, batch: BatchWorld) -> None:
    queues = {t: batch.emulator.create_queue(f"od-{t.split('.')[0]}") for t in TYPES}
    for held in TYPES[:2]:
        batch.emulator.hold(queues[held], "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY")
    try:
        dag = harness.write_dag(
            "batch_instance_fallback",
            _operator(
                batch.backend_source(queues_by_instance_type=queues),
                harness.toy_command(str(harness.tmp / "out"), 2, 0.05),
                "OnDemand(instances=InstanceFallback(capacity_wait=2), backoff=0)",
                f"file://{harness.tmp / 'ckpt'}",
            ),
        )
        attempts = _attempts(harness.run(dag, "batch_instance_fallback"))
    finally:
        for held in TYPES[:2]:
            batch.emulator.release(queues[held])
    _held_then_ran(attempts, "on-demand")
    assert [a["queue"] for a in attempts] == [queues[t] for t in TYPES]
    assert [b["jobQueue"] for b in batch.bodies("SubmitJob")] == [queues[t] for t in TYPES]
    assert [b["jobId"] for b in batch.bodies("TerminateJob")] == [a["job_id"] for a in attempts[:2]]


def test_local_runs_on_the_gpu_model_of_the_third_type_when_the_machine_lacks_the_first_two(
    harness: Harness,
) -> None:
    # a machine with two L40S and one T4: no H100 (p5), no A100 (p4d); g6e's L40S are here
    smi = harness.tmp / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        "  --query-gpu=index,name) printf '0, NVIDIA L40S\\n1, Tesla T4\\n2, NVIDIA L40S\\n' ;;\n"
        "  *) printf '0\\n1\\n2\\n' ;;\n"
        "esac\n"
    )
    smi.chmod(0o755)
    out = harness.tmp / "out"
    command = repr(
        [
            "/bin/sh",
            "-c",
            f'mkdir -p {out} && echo "$CUDA_VISIBLE_DEVICES" > {out}/devices && exec "$@"',
            "job",
            *harness.toy_args(str(out), 2, 0.05),
        ]
    )
    dag = harness.write_dag(
        "local_instance_fallback",
        _operator(
            f"LocalBackend(state_dir={str(harness.state_dir)!r}, nvidia_smi={str(smi)!r}, grace_period=2)",
            command,
            "OnDemand(instances=InstanceFallback(capacity_wait=1.5), backoff=0)",
            f"file://{harness.tmp / 'ckpt'}",
            gpus=2,
        ),
    )
    run = harness.run(dag, "local_instance_fallback")
    attempts = _attempts(run)
    _held_then_ran(attempts, "on-demand", priced=False)
    assert "waiting for GPUs: h100 for instance type p5.48xlarge: this machine has no h100 GPU" in run.log
    # the job ran on the machine's two L40S, not on the T4
    assert (out / "devices").read_text().strip() == "0,2"
