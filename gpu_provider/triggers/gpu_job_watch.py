"""``GpuJobWatchTrigger``: :class:`~gpu_provider.triggers.gpu_job.GpuJobTrigger` for a task that watches
a job it does not own (``GpuJobSensor``).

It waits the same way, through the same :class:`~gpu_provider.triggers.gpu_job.SharedPoller` (so
sensors and operators of one backend share one batched status call per tick), but killing the
deferred task leaves the job alone: the job belongs to another task, which decides about it.
"""

from __future__ import annotations

from gpu_provider.triggers.gpu_job import GpuJobTrigger


class GpuJobWatchTrigger(GpuJobTrigger):
    """Waits for one job to end (or for ``deadline``), like ``GpuJobTrigger``; ``on_kill`` cancels nothing.

    Takes and serialises the same arguments as :class:`~gpu_provider.triggers.gpu_job.GpuJobTrigger`
    (its class path is its own, so the triggerer rebuilds this class). A status that says the job can
    never start does not end its wait: only the job's owner stops such a job.
    """

    owns_job = False

    async def on_kill(self) -> None:
        """The watching task was killed: the watched job is not its to stop."""
        self.log.info(
            "Stopped watching %s job %s; the job itself is left running.",
            self.backend.get("name"),
            self.handle.get("job_id"),
        )
