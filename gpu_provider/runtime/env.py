"""The job's view of its environment: checkpoint locations, attempt, capacity and a torchrun-ready rendezvous.

Every backend sets the ``GPU_PROVIDER_*`` variables and, where it can, ``NNODES``, ``NODE_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT``. Where one of those four is absent, :func:`job_env` derives it
from what the service itself provides:

- AWS Batch multi-node (``AWS_BATCH_JOB_NUM_NODES`` set): nodes from it, rank from
  ``AWS_BATCH_JOB_NODE_INDEX``, master from ``AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS``, which
  Batch leaves out on the main node itself, where the master is ``127.0.0.1``.
- SageMaker training (``SM_HOSTS``, a JSON list, and ``SM_CURRENT_HOST``): nodes = number of hosts,
  rank = index of the current host in the sorted hosts, master = the first sorted host. Without
  them (images not built on SageMaker's training toolkit), the same from SageMaker's
  ``resourceconfig.json`` (``hosts``, ``current_host``) in ``$SM_INPUT_CONFIG_DIR``, else
  ``/opt/ml/input/config``, where that file exists.
- Kubernetes indexed Job (``JOB_COMPLETION_INDEX``): the rank only; ``NNODES`` and ``MASTER_ADDR``
  must come from our variables (the backend sets them to the Job's size and headless Service).

Our own variables win over the derived ones, one variable at a time. Without any of them the job
is a single node: ``NNODES=1``, ``NODE_RANK=0``, ``MASTER_ADDR=127.0.0.1``, ``MASTER_PORT=29500``.
Empty values count as absent.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass

from gpu_provider.names import (  # defined once for the operator, the backends and the job
    CAPACITY_TYPES,
    ENV_ATTEMPT,
    ENV_CAPACITY,
    ENV_CHECKPOINT_URI,
    ENV_OUTPUT_FILE,
    ENV_RESUME_FROM,
    ON_DEMAND,
)

ENV_NNODES = "NNODES"
ENV_NODE_RANK = "NODE_RANK"
ENV_MASTER_ADDR = "MASTER_ADDR"
ENV_MASTER_PORT = "MASTER_PORT"

BATCH_NUM_NODES = "AWS_BATCH_JOB_NUM_NODES"
BATCH_NODE_INDEX = "AWS_BATCH_JOB_NODE_INDEX"
BATCH_MAIN_NODE_INDEX = "AWS_BATCH_JOB_MAIN_NODE_INDEX"
BATCH_MAIN_NODE_ADDRESS = "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"
SAGEMAKER_HOSTS = "SM_HOSTS"
SAGEMAKER_CURRENT_HOST = "SM_CURRENT_HOST"
SAGEMAKER_CONFIG_DIR = "SM_INPUT_CONFIG_DIR"
DEFAULT_SAGEMAKER_CONFIG_DIR = "/opt/ml/input/config"
K8S_COMPLETION_INDEX = "JOB_COMPLETION_INDEX"

DEFAULT_MASTER_ADDR = "127.0.0.1"
DEFAULT_MASTER_PORT = 29500

#: the variables :func:`export_torchrun_env` returns, in torchrun's spelling
TORCHRUN_VARIABLES = (ENV_NNODES, ENV_NODE_RANK, ENV_MASTER_ADDR, ENV_MASTER_PORT)


@dataclass(frozen=True)
class JobEnv:
    """What the job needs to know about this run, normalised across backends.

    :param checkpoint_uri: where this job writes checkpoints (``file://`` or ``s3://``), or ``None``.
    :param resume_from: the hint ``GPU_PROVIDER_RESUME_FROM``: the newest checkpoint when the attempt
        was submitted, or ``None``. A service that restarts the job inside the attempt keeps this
        value while newer checkpoints exist: restore what
        :func:`~gpu_provider.runtime.resume_checkpoint` returns, which looks in the store itself.
    :param attempt: 1, 2, ... across preemptions and Airflow retries.
    :param capacity: ``"spot"`` or ``"on-demand"`` for this attempt.
    :param nnodes: number of nodes taking part in the rendezvous.
    :param node_rank: this node's rank, ``0 <= node_rank < nnodes``.
    :param master_addr: address of the rank-0 node.
    :param master_port: rendezvous port on the rank-0 node.
    :param output_file: file in which :func:`~gpu_provider.runtime.declare_output` records the output URI.
    """

    checkpoint_uri: str | None = None
    resume_from: str | None = None
    attempt: int = 1
    capacity: str = ON_DEMAND
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = DEFAULT_MASTER_ADDR
    master_port: int = DEFAULT_MASTER_PORT
    output_file: str | None = None

    def __post_init__(self) -> None:
        if self.attempt < 1:
            raise ValueError(f"attempt must be >= 1, got {self.attempt}")
        if self.capacity not in CAPACITY_TYPES:
            raise ValueError(f"capacity {self.capacity!r} is not allowed: allowed: {', '.join(CAPACITY_TYPES)}")
        if self.nnodes < 1:
            raise ValueError(f"nnodes must be >= 1, got {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"node_rank must be in [0, {self.nnodes}), got {self.node_rank}")
        if not self.master_addr:
            raise ValueError("master_addr must not be empty")
        if not 0 < self.master_port < 65536:
            raise ValueError(f"master_port must be in [1, 65535], got {self.master_port}")

    @property
    def is_main(self) -> bool:
        """Whether this node has rank 0 (the node that should save checkpoints and declare outputs)."""
        return self.node_rank == 0


@dataclass(frozen=True)
class _Sourced:
    """A value and the variable it came from, so an error can name the variable."""

    value: str
    source: str


def _get(environ: Mapping[str, str], name: str) -> _Sourced | None:
    value = environ.get(name, "").strip()
    return _Sourced(value, name) if value else None


def _to_int(item: _Sourced, *, minimum: int) -> int:
    try:
        number = int(item.value)
    except ValueError as exc:
        raise ValueError(f"{item.source}={item.value!r} is not an integer") from exc
    if number < minimum:
        raise ValueError(f"{item.source}={item.value!r} must be >= {minimum}")
    return number


def _service_rendezvous(environ: Mapping[str, str]) -> dict[str, _Sourced]:
    """Rendezvous values derived from AWS Batch, SageMaker or a Kubernetes indexed Job (first match wins)."""
    num_nodes = _get(environ, BATCH_NUM_NODES)
    if num_nodes is not None:
        return _batch_rendezvous(environ, num_nodes)
    hosts = _get(environ, SAGEMAKER_HOSTS)
    if hosts is not None:
        return _sagemaker_rendezvous(environ, hosts)
    from_config = _sagemaker_resource_config(environ)
    if from_config is not None:
        return from_config
    index = _get(environ, K8S_COMPLETION_INDEX)
    if index is not None:
        return {ENV_NODE_RANK: index}
    return {}


def _batch_rendezvous(environ: Mapping[str, str], num_nodes: _Sourced) -> dict[str, _Sourced]:
    found = {ENV_NNODES: num_nodes}
    node_index = _get(environ, BATCH_NODE_INDEX)
    if node_index is not None:
        found[ENV_NODE_RANK] = node_index
    main_address = _get(environ, BATCH_MAIN_NODE_ADDRESS)
    if main_address is not None:
        found[ENV_MASTER_ADDR] = main_address
    else:
        # Batch leaves the main node's address out on the main node itself. That node only has to
        # reach its own rendezvous store, which listens on every interface, so loopback is right and
        # needs no DNS lookup. On any other node the variable is required.
        main_index = _get(environ, BATCH_MAIN_NODE_INDEX)
        if node_index is not None and main_index is not None and node_index.value != main_index.value:
            raise ValueError(
                f"{BATCH_MAIN_NODE_ADDRESS} is not set on AWS Batch node {node_index.value} "
                f"(main node is {main_index.value}): cannot find the rendezvous address"
            )
        found[ENV_MASTER_ADDR] = _Sourced(DEFAULT_MASTER_ADDR, BATCH_MAIN_NODE_ADDRESS)
    return found


def _sagemaker_resource_config(environ: Mapping[str, str]) -> dict[str, _Sourced] | None:
    """The rendezvous from SageMaker's ``resourceconfig.json``, ``None`` where there is no such file."""
    folder = _get(environ, SAGEMAKER_CONFIG_DIR)
    path = os.path.join(folder.value if folder else DEFAULT_SAGEMAKER_CONFIG_DIR, "resourceconfig.json")
    try:
        with open(path, encoding="utf-8") as handle:
            config = json.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} is not readable JSON: {exc}") from exc
    hosts, current = (config.get("hosts"), config.get("current_host")) if isinstance(config, dict) else (None, None)
    if not isinstance(current, str):
        raise ValueError(f"{path} has no current_host (a host name): {config!r}")
    pseudo = {SAGEMAKER_CURRENT_HOST: current}
    return _sagemaker_rendezvous(pseudo, _Sourced(json.dumps(hosts), path))


def _sagemaker_rendezvous(environ: Mapping[str, str], hosts_item: _Sourced) -> dict[str, _Sourced]:
    try:
        hosts = json.loads(hosts_item.value)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{SAGEMAKER_HOSTS}={hosts_item.value!r} is not a JSON list of host names") from exc
    if not isinstance(hosts, list) or not hosts or not all(isinstance(h, str) and h for h in hosts):
        raise ValueError(f"{SAGEMAKER_HOSTS}={hosts_item.value!r} is not a non-empty JSON list of host names")
    ordered = sorted(hosts)
    found = {
        ENV_NNODES: _Sourced(str(len(ordered)), SAGEMAKER_HOSTS),
        ENV_MASTER_ADDR: _Sourced(ordered[0], SAGEMAKER_HOSTS),
    }
    current = _get(environ, SAGEMAKER_CURRENT_HOST)
    if current is not None:
        if current.value not in ordered:
            raise ValueError(
                f"{SAGEMAKER_CURRENT_HOST}={current.value!r} is not one of {SAGEMAKER_HOSTS}={hosts_item.value!r}"
            )
        found[ENV_NODE_RANK] = _Sourced(str(ordered.index(current.value)), SAGEMAKER_CURRENT_HOST)
    return found


def job_env(environ: Mapping[str, str] | None = None) -> JobEnv:
    """Read and validate the job's environment.

    :param environ: the variables to read; ``os.environ`` when ``None``.
    :return: the normalised :class:`JobEnv`.
    :raises ValueError: a variable holds a bad value (the message names the variable and the value),
        or the rank is not below the number of nodes.
    """
    env = os.environ if environ is None else environ
    rendezvous = _service_rendezvous(env)
    for name in TORCHRUN_VARIABLES:
        ours = _get(env, name)
        if ours is not None:
            rendezvous[name] = ours

    nnodes_item = rendezvous.get(ENV_NNODES)
    rank_item = rendezvous.get(ENV_NODE_RANK)
    addr_item = rendezvous.get(ENV_MASTER_ADDR)
    port_item = rendezvous.get(ENV_MASTER_PORT)
    nnodes = _to_int(nnodes_item, minimum=1) if nnodes_item else 1
    node_rank = _to_int(rank_item, minimum=0) if rank_item else 0
    if rank_item is not None and node_rank >= nnodes:
        nodes_from = nnodes_item.source if nnodes_item else f"{ENV_NNODES} (unset, default 1)"
        raise ValueError(
            f"{rank_item.source}={rank_item.value!r} must be below the number of nodes {nnodes}, from {nodes_from}"
        )
    master_port = _to_int(port_item, minimum=1) if port_item else DEFAULT_MASTER_PORT
    if master_port > 65535:
        raise ValueError(f"{ENV_MASTER_PORT}={master_port} must be <= 65535")

    attempt_item = _get(env, ENV_ATTEMPT)
    capacity_item = _get(env, ENV_CAPACITY)
    capacity = ON_DEMAND
    if capacity_item is not None:
        capacity = capacity_item.value.lower().replace("_", "-")
        if capacity not in CAPACITY_TYPES:
            raise ValueError(
                f"{ENV_CAPACITY}={capacity_item.value!r} is not allowed: allowed: {', '.join(CAPACITY_TYPES)}"
            )

    checkpoint_uri = _get(env, ENV_CHECKPOINT_URI)
    resume_from = _get(env, ENV_RESUME_FROM)
    output_file = _get(env, ENV_OUTPUT_FILE)
    return JobEnv(
        checkpoint_uri=checkpoint_uri.value if checkpoint_uri else None,
        resume_from=resume_from.value if resume_from else None,
        attempt=_to_int(attempt_item, minimum=1) if attempt_item else 1,
        capacity=capacity,
        nnodes=nnodes,
        node_rank=node_rank,
        master_addr=addr_item.value if addr_item else DEFAULT_MASTER_ADDR,
        master_port=master_port,
        output_file=output_file.value if output_file else None,
    )


def export_torchrun_env(env: JobEnv) -> dict[str, str]:
    """The four rendezvous variables torchrun reads, ready to merge into a child's environment.

    ``WORLD_SIZE`` is left out on purpose: torchrun computes it from the nodes and processes per node.

    :param env: the normalised environment, from :func:`job_env`.
    :return: ``NNODES``, ``NODE_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` as strings.
    """
    return {
        ENV_NNODES: str(env.nnodes),
        ENV_NODE_RANK: str(env.node_rank),
        ENV_MASTER_ADDR: env.master_addr,
        ENV_MASTER_PORT: str(env.master_port),
    }
