"""A trigger the triggerer cancels stops, even when its status arrives in the same instant.

``asyncio.wait_for`` on Python 3.10 and 3.11 returns the awaited result instead of raising when the
cancellation and the result meet (reproduced below with ``asyncio.wait_for``): a cancelled trigger then
went on waiting for a job that never starts, for ever (a 300 s test timeout under load found it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from gpu_provider.triggers.gpu_job import TIMED_OUT, within


async def _cancel_as_the_item_arrives(wait: Callable[[Awaitable[Any], float], Awaitable[Any]]) -> str:
    queue: asyncio.Queue[int] = asyncio.Queue()
    waiter = asyncio.ensure_future(wait(queue.get(), 10))
    for _ in range(3):  # the waiter is now blocked on the queue
        await asyncio.sleep(0)
    queue.put_nowait(1)
    await asyncio.sleep(0)  # the queue's getter completes; the waiter has not resumed yet
    waiter.cancel()
    try:
        await waiter
    except asyncio.CancelledError:
        return "cancelled"
    return "swallowed"


def test_a_cancel_that_meets_the_result_still_cancels() -> None:
    assert asyncio.run(_cancel_as_the_item_arrives(within)) == "cancelled"


def test_the_race_is_real_with_wait_for_on_this_python() -> None:
    import sys

    outcome = asyncio.run(_cancel_as_the_item_arrives(lambda aw, t: asyncio.wait_for(aw, t)))
    # fixed in 3.12's asyncio.timeout-based wait_for; on 3.10/3.11 this is what hung a trigger
    assert outcome == ("cancelled" if sys.version_info >= (3, 12) else "swallowed")


def test_a_timeout_leaves_the_item_for_the_next_wait() -> None:
    async def main() -> tuple[Any, Any]:
        queue: asyncio.Queue[int] = asyncio.Queue()
        first = await within(queue.get(), 0.01)
        queue.put_nowait(7)
        return first, await within(queue.get(), 1)

    assert asyncio.run(main()) == (TIMED_OUT, 7)


def test_no_timeout_waits_for_the_result() -> None:
    async def main() -> int:
        queue: asyncio.Queue[int] = asyncio.Queue()
        asyncio.get_running_loop().call_later(0.05, queue.put_nowait, 3)
        return await within(queue.get(), None)

    assert asyncio.run(main()) == 3


@pytest.mark.parametrize("timeout", [None, 5.0])
def test_cancelling_a_plain_wait_cancels(timeout: float | None) -> None:
    async def main() -> bool:
        waiter = asyncio.ensure_future(within(asyncio.Event().wait(), timeout))
        await asyncio.sleep(0.01)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        return waiter.cancelled()

    assert asyncio.run(main())
