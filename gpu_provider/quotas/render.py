"""The quota file rendered into each service's own quota objects (``gpu-provider quotas render``).

- AWS Batch: a fair-share scheduling policy (the ``CreateSchedulingPolicy`` request, ready for
  ``aws batch create-scheduling-policy --cli-input-json``). Each team is a share identifier; Batch
  gives a share ``1 / weightFactor`` of the queue, so a team's factor is the largest team's GPUs
  divided by its own (the largest team: 1.0, a team with half its GPUs: 2.0). Attach the policy to
  the job queues the Batch backend submits to; the backend then sends each job's ``shareIdentifier``
  (its team's) and ``schedulingPriorityOverride`` (its ``priority=``).
- Kubernetes: a ``ResourceQuota`` on ``requests.nvidia.com/gpu`` in each team's namespace.
- Kueue (clusters that run it, instead of ResourceQuotas): a ``ResourceFlavor``, one
  ``ClusterQueue`` per team with the team's GPUs as nominal quota (in a shared cohort when the file
  names one, so idle GPUs can be borrowed) and a ``LocalQueue`` ``gpu`` in the team's namespace.
"""

from __future__ import annotations

from typing import Any

from gpu_provider.quotas.file import Quotas

#: the Kubernetes extended resource of NVIDIA GPUs
GPU_RESOURCE = "nvidia.com/gpu"
#: Batch's bounds on a share's weightFactor
MIN_WEIGHT, MAX_WEIGHT = 0.0001, 999.9999
KUEUE_API = "kueue.x-k8s.io/v1beta1"
#: the LocalQueue in each team namespace (pods name it in the label kueue.x-k8s.io/queue-name)
KUEUE_LOCAL_QUEUE = "gpu"
QUOTA_NAME = "gpu-quota"


def _labels(team: str) -> dict[str, str]:
    return {"app.kubernetes.io/managed-by": "gpu-provider", "gpu-provider/team": team}


def share_weight(gpus: int, most: int) -> float:
    """Batch weightFactor of a team with ``gpus`` when the largest team has ``most`` (lower: larger share)."""
    if gpus <= 0:
        return MAX_WEIGHT
    return min(MAX_WEIGHT, max(MIN_WEIGHT, round(most / gpus, 4)))


def batch_scheduling_policy(
    quotas: Quotas, *, name: str = "gpu-teams", share_decay_seconds: int = 3600, compute_reservation: int = 0
) -> dict[str, Any]:
    """The ``CreateSchedulingPolicy`` request for the teams' fair share."""
    if not 0 <= share_decay_seconds <= 604800:
        raise ValueError(f"share_decay_seconds={share_decay_seconds!r} must be 0 to 604800 (one week)")
    if not 0 <= compute_reservation <= 99:
        raise ValueError(f"compute_reservation={compute_reservation!r} must be 0 to 99 (percent)")
    most = max(t.gpus for t in quotas.teams) or 1
    return {
        "name": name,
        "fairsharePolicy": {
            "shareDecaySeconds": share_decay_seconds,
            "computeReservation": compute_reservation,
            "shareDistribution": [
                {"shareIdentifier": t.share_identifier, "weightFactor": share_weight(t.gpus, most)}
                for t in quotas.teams
            ],
        },
        "tags": {"gpu-provider/managed": "true"},
    }


def resource_quotas(quotas: Quotas) -> list[dict[str, Any]]:
    """One ResourceQuota per team namespace: the team's pods may request at most its GPUs."""
    return [
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": QUOTA_NAME, "namespace": t.namespace, "labels": _labels(t.team)},
            "spec": {"hard": {f"requests.{GPU_RESOURCE}": str(t.gpus)}},
        }
        for t in quotas.teams
    ]


def kueue_queues(quotas: Quotas) -> list[dict[str, Any]]:
    """A ResourceFlavor, then a ClusterQueue and a LocalQueue per team."""
    docs: list[dict[str, Any]] = [
        {"apiVersion": KUEUE_API, "kind": "ResourceFlavor", "metadata": {"name": quotas.kueue_flavor}}
    ]
    for t in quotas.teams:
        cluster_queue = f"gpu-{t.namespace}"
        spec: dict[str, Any] = {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": t.namespace}},
            "queueingStrategy": "BestEffortFIFO",
            "resourceGroups": [
                {
                    "coveredResources": [GPU_RESOURCE],
                    "flavors": [
                        {"name": quotas.kueue_flavor, "resources": [{"name": GPU_RESOURCE, "nominalQuota": t.gpus}]}
                    ],
                }
            ],
        }
        if quotas.kueue_cohort:
            spec["cohort"] = quotas.kueue_cohort
        docs.append(
            {
                "apiVersion": KUEUE_API,
                "kind": "ClusterQueue",
                "metadata": {"name": cluster_queue, "labels": _labels(t.team)},
                "spec": spec,
            }
        )
        docs.append(
            {
                "apiVersion": KUEUE_API,
                "kind": "LocalQueue",
                "metadata": {"name": KUEUE_LOCAL_QUEUE, "namespace": t.namespace, "labels": _labels(t.team)},
                "spec": {"clusterQueue": cluster_queue},
            }
        )
    return docs
