"""GPU hardware faults recognised in a job's own output: the failures that are the node's, not the job's.

One table, :data:`OUTPUT_FAULTS`, of the messages the NVIDIA driver, the CUDA runtime, NVML and
PyTorch's NCCL watchdog print when the hardware under a job fails. The local backend's supervisor
reads every line of each node through :func:`fault_in_line`; the task treats a failed attempt whose
output carried one as an interruption of kind :data:`gpu_provider.names.NODE_FAULT`.

Messages left out on purpose, because an application bug prints them as often as broken hardware
does: CUDA's ``unspecified launch failure`` and ``illegal memory access``, NCCL's ``unhandled system
error``, and an NCCL timeout on a single-node job.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from gpu_provider.names import FAULT_ECC, FAULT_GPU_LOST, FAULT_NCCL_TIMEOUT, FAULT_XID, NODE_FAULT_EXIT_CODES


class OutputFault(NamedTuple):
    """One row: the fault kind, the pattern searched in a line, whether it needs a multi-node job."""

    kind: str
    pattern: re.Pattern[str]
    multi_node_only: bool = False


#: the table, most specific first (a line naming Xid 79 "fallen off the bus" is the lost GPU, not any Xid)
OUTPUT_FAULTS: tuple[OutputFault, ...] = (
    # the driver: "NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus."
    OutputFault(FAULT_GPU_LOST, re.compile(r"GPU has fallen off the bus", re.I)),
    # NVML / nvidia-smi: "Unable to determine the device handle for GPU0000:3B:00.0: GPU is lost."
    OutputFault(FAULT_GPU_LOST, re.compile(r"\bGPU is lost\b", re.I)),
    # the CUDA runtime (cudaErrorECCUncorrectable): "CUDA error: uncorrectable ECC error encountered"
    OutputFault(FAULT_ECC, re.compile(r"uncorrectable ECC error", re.I)),
    # the driver, Xid 48: "An uncorrectable double bit error (DBE) has been detected on GPU ..."
    OutputFault(FAULT_ECC, re.compile(r"double bit error \(DBE\)", re.I)),
    # the driver: "NVRM: Xid (PCI:0000:00:1e): 13, pid=..., Graphics Exception ..."
    OutputFault(FAULT_XID, re.compile(r"NVRM: Xid \(")),
    # PyTorch's ProcessGroupNCCL: "[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(...)"
    OutputFault(FAULT_NCCL_TIMEOUT, re.compile(r"Watchdog caught collective operation timeout"), True),
)


def fault_in_line(line: str, *, nodes: int = 1) -> str | None:
    """The fault kind a line of the job's output reports, or ``None``.

    :param line: one line of output
    :param nodes: the job's node count (an NCCL timeout counts as a node fault only on several nodes)
    """
    for row in OUTPUT_FAULTS:
        if row.multi_node_only and nodes < 2:
            continue
        if row.pattern.search(line):
            return row.kind
    return None


def fault_of_exit_code(code: int | None) -> str | None:
    """The fault kind the runtime helper's exit status reports (:data:`~gpu_provider.names.NODE_FAULT_EXIT_CODES`)."""
    for kind, value in NODE_FAULT_EXIT_CODES.items():
        if code == value:
            return kind
    return None
