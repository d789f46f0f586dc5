"""The Kubernetes log cursor (``gpu_provider.backends.kubernetes.logs``): each line once, in order,
whatever a read brings again (the lines of the cursor's second, a whole log from a server that gives
no timestamps, a cursor of an earlier version counting lines)."""

from __future__ import annotations

from gpu_provider.backends.kubernetes.logs import PodMark, take

BIG = 10**6
#: (second, nanoseconds, text): two lines share one timestamp, as a fast writer's may
LINES = [(1, 5, "a"), (1, 5, "b"), (1, 7, "c"), (2, 0, "d")]


def _stamped(lines: list[tuple[int, int, str]]) -> bytes:
    return b"".join(f"2026-12-05T08:00:0{s}.{ns:09d}Z {t}\n".encode() for s, ns, t in lines)


def _read(data: bytes, mark: PodMark, *, ended: bool = False) -> list[str]:
    out: list[str] = []
    take(data, mark, limit=BIG, ended=ended, budget=BIG, prefix="", out=out)
    return out


def test_lines_sharing_a_timestamp_are_each_taken_once() -> None:
    mark = PodMark()
    assert _read(_stamped(LINES[:2]), mark) == ["a", "b"]
    again = PodMark.load(mark.dump())
    assert again.since() == "2026-12-05T08:00:01Z"  # the whole second: its lines come again
    assert _read(_stamped(LINES[:3]), again) == ["c"]
    assert _read(_stamped(LINES[3:]), PodMark.load(again.dump())) == ["d"]


def test_a_cursor_counting_lines_from_an_earlier_version_goes_on_after_them() -> None:
    mark = PodMark.load(1)
    assert mark.since() is None  # read from the start
    assert _read(_stamped(LINES), mark) == ["b", "c", "d"]
    assert isinstance(mark.dump(), dict)


def test_a_server_without_timestamps_still_gives_each_line_once() -> None:
    mark = PodMark()
    assert _read(b"x\ny\n", mark) == ["x", "y"] and mark.dump() == 2
    assert _read(b"x\ny\nz\n", PodMark.load(mark.dump())) == ["z"]


def test_a_running_container_s_unfinished_line_waits_and_an_ended_one_s_is_taken() -> None:
    data = _stamped(LINES[:1]) + b"2026-12-05T08:00:03Z partial"
    mark = PodMark()
    assert _read(data, mark) == ["a"]
    assert _read(data, PodMark.load(mark.dump()), ended=True) == ["partial"]


def test_a_settled_second_is_not_read_again() -> None:
    mark = PodMark()
    _read(_stamped(LINES), mark)
    assert mark.since() == "2026-12-05T08:00:02Z" and mark.second_bytes > 0
    mark.settle()  # no complete read began after that second: it may still bring lines
    assert mark.since() == "2026-12-05T08:00:02Z"
    mark.caught_up = mark.key[0] + 1.5  # type: ignore[index]
    mark.settle()  # too soon after the second (the clocks may differ)
    assert mark.since() == "2026-12-05T08:00:02Z"
    mark.caught_up = mark.key[0] + 10.0  # type: ignore[index]
    mark.settle()
    assert mark.since() == "2026-12-05T08:00:03Z" and mark.second_bytes == 0
    assert _read(_stamped([(3, 1, "e")]), mark) == ["e"]
