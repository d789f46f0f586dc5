"""The SageMaker backend: each attempt is one SageMaker training job, managed spot for spot attempts.

* :mod:`~gpu_provider.backends.sagemaker.backend`: :class:`SageMakerBackend`, which orchestrates the modules below;
* :mod:`~gpu_provider.backends.sagemaker.options`: its options, read and checked;
* :mod:`~gpu_provider.backends.sagemaker.requests`: the CreateTrainingJob body (command, instances, spot, env, tags);
* :mod:`~gpu_provider.backends.sagemaker.service`: the training job calls (create, describe, list, tags, stop);
* :mod:`~gpu_provider.backends.sagemaker.status`: a described job as a JobStatus, a JobHandle, an OwnedJob;
* :mod:`~gpu_provider.backends.sagemaker.ownership`: tag text, ``mark``, ``read_owner`` and the tagged stop;
* :mod:`~gpu_provider.backends.sagemaker.logs`: the job's CloudWatch streams, read and tailed;
* :mod:`~gpu_provider.backends.sagemaker.cache`: what polls saw, for polling only;
* :mod:`~gpu_provider.backends.sagemaker.mapping`: what SageMaker's states mean, the instance table.

Clients, throttling backoff, the create sent again after a lost answer, the rule for a job the service no
longer returns and CloudWatch log reading are shared with the Batch backend (:mod:`gpu_provider.backends.aws`);
the ``master_port`` option, the owner-try check and the job-name pattern with every backend
(:mod:`gpu_provider.backends.common`). Nothing here imports boto3 until a client is needed.
"""

from __future__ import annotations

from gpu_provider.backends.sagemaker.backend import CHECKPOINT_LOCAL_PATH, LOG_GROUP, SageMakerBackend
from gpu_provider.backends.sagemaker.mapping import INSTANCE_TABLE, STATE_TABLE, instance_type_for

__all__ = [
    "CHECKPOINT_LOCAL_PATH",
    "INSTANCE_TABLE",
    "LOG_GROUP",
    "STATE_TABLE",
    "SageMakerBackend",
    "instance_type_for",
]
