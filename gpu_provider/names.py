"""Names shared by the operator, the trigger, the backends and the job: defined once, here.

Environment variables of the job contract, capacity spellings, tag/label keys, event statuses and
interruption kinds. Backends, the runtime helper and tests import these instead of writing the
literals again.
"""

from __future__ import annotations

# --- capacity types an attempt can run on ------------------------------------------------------
SPOT = "spot"
ON_DEMAND = "on-demand"
CAPACITY_TYPES = (SPOT, ON_DEMAND)

# --- the job's environment contract ------------------------------------------------------------
ENV_CHECKPOINT_URI = "GPU_PROVIDER_CHECKPOINT_URI"
ENV_CHECKPOINT_KEEP = "GPU_PROVIDER_CHECKPOINT_KEEP"
ENV_RESUME_FROM = "GPU_PROVIDER_RESUME_FROM"
ENV_ATTEMPT = "GPU_PROVIDER_ATTEMPT"
ENV_CAPACITY = "GPU_PROVIDER_CAPACITY"
ENV_OUTPUT_FILE = "GPU_PROVIDER_OUTPUT_FILE"
ENV_PREFIX = "GPU_PROVIDER_"
#: JSON ``{"NAME": "<Secrets Manager ARN or SSM parameter>"}``: references the in-job runtime helper
#: (``python -m gpu_provider.runtime.secrets``) resolves with the job's own role (SageMaker ``secrets=``)
ENV_SECRET_REFS = "GPU_PROVIDER_SECRET_REFS"
#: rendezvous variables, normalised on every backend
RENDEZVOUS_ENV = ("NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")

# --- interruption kinds: an attempt that ended without the job's own fault ----------------------
PREEMPTED = "preempted"
"""The capacity was taken back (spot reclaim, host lost)."""
CAPACITY_TIMEOUT = "capacity_timeout"
"""The attempt waited for capacity longer than its policy allows (given up by us or by the service)."""
LOST = "lost"
"""The service no longer knows the job (expired or deleted): nobody can tell how it ended."""
NODE_FAULT = "node_fault"
"""The hardware under the job failed (a GPU XID or uncorrectable ECC error, a GPU fallen off the bus, an
NCCL watchdog timeout on a multi-node job, an unhealthy node or host): its own budget
(``max_node_faults``), resubmitted on fresh hardware and resumed from the checkpoint."""
INTERRUPTION_KINDS = (PREEMPTED, CAPACITY_TIMEOUT, LOST, NODE_FAULT)
MOVED_TO_SPOT = "moved_to_spot"
"""Not an interruption: a planned move. The task ended an on-demand attempt at a checkpoint because spot capacity
returned and saves enough (``SpotFallback(spot_return=SpotReturn(...))``); the next attempt runs on spot. Not
counted against ``max_interruptions``; bounded by the policy's ``max_moves`` and ``cooldown``."""
PLANNED_MOVES = (MOVED_TO_SPOT,)

# --- node faults: what failed under the job (``JobStatus.fault``) --------------------------------
FAULT_XID = "xid"
"""The NVIDIA driver logged an Xid error for the GPU (``NVRM: Xid``)."""
FAULT_ECC = "ecc"
"""An uncorrectable ECC error in GPU memory."""
FAULT_GPU_LOST = "gpu_lost"
"""The GPU fell off the bus or is lost to the driver."""
FAULT_NCCL_TIMEOUT = "nccl_timeout"
"""PyTorch's NCCL watchdog timed out a collective on a multi-node job (a peer or link went away)."""
FAULT_NODE_UNHEALTHY = "node_unhealthy"
"""The service says the node, host or GPU device is unhealthy (Kubernetes, Batch, SageMaker)."""
FAULT_KINDS = (FAULT_XID, FAULT_ECC, FAULT_GPU_LOST, FAULT_NCCL_TIMEOUT, FAULT_NODE_UNHEALTHY)
NODE_FAULT_EXIT_CODES = {FAULT_XID: 171, FAULT_ECC: 172, FAULT_GPU_LOST: 173, FAULT_NCCL_TIMEOUT: 174}
"""The runtime helper's exit status for a command that failed after its output reported a GPU hardware
fault (``python -m gpu_provider.runtime.launch``): every backend reads the exit code the service reports
(Batch ``exitCode``, SageMaker's ``exit code:`` in ``FailureReason``, a pod's terminated ``exitCode``)."""

# --- trigger events: one per way an attempt's wait can end --------------------------------------
EVENT_SUCCEEDED = "succeeded"
EVENT_FAILED = "failed"
EVENT_PREEMPTED = "preempted"
EVENT_CANCELLED = "cancelled"
EVENT_CAPACITY_TIMEOUT = "capacity_timeout"
EVENT_QUEUE_TIMEOUT = "queue_timeout"
EVENT_DEADLINE = "deadline"
EVENT_POLL_ERROR = "poll_error"
EVENT_RESTART_LIMIT = "restart_limit"
"""The service restarted the attempt inside the job (managed spot) as often as the capacity policy
tolerates on its capacity: the task stops it and the policy's next attempt runs (e.g. on-demand)."""
EVENT_BUDGET = "budget"
"""The attempt's running cost crossed the task's ``max_cost_usd``: the task stops the job."""
EVENT_BACKOFF_DONE = "backoff_done"
"""The backoff before a resubmission is over (``GpuBackoffTrigger``; the task resumes in ``resubmit``)."""
EVENT_NEVER_STARTS = "never_starts"
"""The service says the queued attempt can never start as submitted (``JobStatus.never_starts``): the
task that owns it stops it and fails."""
EVENT_SPOT_RETURNED = "spot_returned"
"""Spot capacity returned while the attempt runs on on-demand, and the move pays (``SpotReturn``): the task
that owns the attempt asks it to checkpoint and stop, and runs the next attempt on spot."""
EVENT_STATUSES = frozenset(
    {
        EVENT_SPOT_RETURNED,
        EVENT_SUCCEEDED,
        EVENT_FAILED,
        EVENT_PREEMPTED,
        EVENT_CANCELLED,
        EVENT_CAPACITY_TIMEOUT,
        EVENT_QUEUE_TIMEOUT,
        EVENT_DEADLINE,
        EVENT_POLL_ERROR,
        EVENT_RESTART_LIMIT,
        EVENT_BUDGET,
        EVENT_NEVER_STARTS,
    }
)

# --- tags / labels on every remote job (cost attribution, the reaper, lookup) -------------------
#: how every remote job's name starts (``gp-<dag>-<task>-<run hash>[-m<map>]-t<try>-a<attempt>``): the
#: EventBridge rules ``gpu-provider events render`` prints match on it
JOB_NAME_PREFIX = "gp-"
TAG_PREFIX = "gpu-provider/"
TAG_DAG_ID = TAG_PREFIX + "dag-id"
TAG_TASK_ID = TAG_PREFIX + "task-id"
TAG_RUN_ID = TAG_PREFIX + "run-id"
TAG_RUN_HASH = TAG_PREFIX + "run-hash"
TAG_MAP_INDEX = TAG_PREFIX + "map-index"
TAG_TRY_NUMBER = TAG_PREFIX + "try-number"
TAG_ATTEMPT = TAG_PREFIX + "attempt"
TAG_CAPACITY = TAG_PREFIX + "capacity"
TAG_TEAM = TAG_PREFIX + "team"
TAG_GPUS = TAG_PREFIX + "gpus"
TAG_OWNER_TRY = TAG_PREFIX + "owner-try"
"""The Airflow try that owns the attempt now (a later try that reattached takes it over)."""
TAG_COLLECTED = TAG_PREFIX + "collected"
"""Set once a try returned or failed on the attempt's result: a new try does not adopt it again."""

# --- reasons this provider writes on jobs it stops, so a lookup can classify them ---------------
CANCEL_PREFIX = "gpu-provider: "
"""Every cancel reason this provider sends starts with this."""
CAPACITY_TIMEOUT_MARK = "capacity timeout: "
"""After :data:`CANCEL_PREFIX`: the cancel gave up waiting for capacity (an interruption, not a kill)."""
UNRUNNABLE_MARK = "cannot run: "
"""After :data:`CANCEL_PREFIX`: the owning task stopped a queued attempt the service said could never start
(the job's own failure, not an interruption)."""
SPOT_RETURN_MARK = "moved to spot: "
"""After :data:`CANCEL_PREFIX`: the task stopped an on-demand attempt at a checkpoint to continue on spot (a
planned move, not an interruption)."""
RESTART_LIMIT_MARK = "restart limit: "
"""After :data:`CANCEL_PREFIX`: the task stopped an attempt the service had restarted inside the job as
often as the capacity policy tolerates (an interruption: the policy's next attempt runs)."""

# --- a stop the task plans for a running attempt (``AttemptRecord.stop``) ------------------------
STOP_PLANNED = "planned"
"""Written on the attempt's record before the stop is sent: the service has not been seen taking it yet, so a try
that resumes (a new try, a resumed deferral) sends it again and reads whether it was taken."""
STOP_CONFIRMED = "confirmed"
"""A fresh read showed the service taking the planned stop (the job stopping, or ended, with the stop's reason):
only then is the job's end the planned one."""
STOP_MARKS = {PREEMPTED: RESTART_LIMIT_MARK, MOVED_TO_SPOT: SPOT_RETURN_MARK}
"""The planned stops by the interruption kind their record carries (a restart limit's stop ends as a preemption,
a move back to spot as ``moved_to_spot``), and the mark their reason starts with."""

# --- the end-of-log marker: the last line of each node's log -----------------------------------
END_OF_LOG = "gpu_provider: end-of-log"
"""Start of the line the runtime helper (``python -m gpu_provider.runtime.launch``), the multi-node entries
of Batch and SageMaker and the local backend's supervisor print when the job's command exits on a node:
``gpu_provider: end-of-log node=<rank> nnodes=<nodes> exit=<code>[ fault=<kind>]`` (format and parse in
:mod:`gpu_provider.runtime.output`). Once the log forwarder has it from every node it stops reading;
jobs without it get the backend's ``log_settle_s`` wait for late lines."""

# --- operators and sensors: limits and keys they share ------------------------------------------
#: the longest ``poll_interval`` an operator or sensor accepts (seconds): a status check at least every hour
MAX_POLL_INTERVAL_S = 3600.0
#: extra time Airflow's own deferral timeout allows past the deadline a trigger enforces itself
#: (a backstop for a triggerer that cannot run the trigger; the trigger acts first)
DEFER_TIMEOUT_SLACK_S = 300.0
#: the task state store key holding a ``GpuJobOperator`` task instance's attempt records (survives
#: worker crashes; the GPU page reads it too)
STATE_KEY = "gpu_provider_attempts"
