"""The CPU stages' process pools under faults: the parent killed, a worker killed, an interrupt,
an absurd ``--workers`` (:mod:`ror_annotate.pool`, used by the segmenter and the baseline rules).

Expected behaviour comes from the operating system (``/proc``: which processes are still running)
and from the serial path (``workers=1``), never from the pool code itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ror_annotate.errors import WorkerError
from ror_annotate.judge.baseline import classify_many
from ror_annotate.pool import interrupts_deferred
from ror_annotate.segment import Segmenter, default_workers, segment_spans_many

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir() or sys.platform != "linux", reason="reads /proc")

REPO = Path(__file__).resolve().parents[1]


def _items(n_traces: int, n_segments: int = 3) -> list[tuple[str, str | None, list[str], list[int]]]:
    texts = ["Wait, is that right?", "So the answer is 4.", "Let me compute 3 + 4 = 7 and 2 * 5 = 10."]
    return [(f"t{i}", "Find x.", [texts[k % 3] for k in range(n_segments)], list(range(n_segments))) for i in range(n_traces)]


def _running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (state ``Z``: ended, waiting to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


CHILD = {
    "baseline": """
        from ror_annotate.judge.baseline import classify_many
        items = [(f"t{i}", None, ["Wait, x."] * 20, list(range(20))) for i in range(200)]
        results = classify_many(iter(items), workers=2, task_segments=20)
        next(results)
    """,
    "segment": """
        from ror_annotate.segment import Segmenter, segment_spans_many
        items = [(f"t{i}", "So x = 4. Wait, that is wrong. Let me redo it." * 20) for i in range(200)]
        results = segment_spans_many(iter(items), segmenter=Segmenter(), workers=2, task_chars=500)
        next(results)
    """,
}


@pytest.mark.parametrize("stage", sorted(CHILD))
def test_workers_end_when_the_parent_is_killed(stage: str) -> None:
    """``kill -9`` of the process that runs a pool leaves no worker, forkserver or tracker running.

    Before ror_annotate.pool.init_worker an idle worker waited for work forever and kept the
    forkserver and the resource tracker alive with it (three processes left per killed run).
    """
    code = textwrap.dedent(CHILD[stage]) + "print('ready', flush=True)\nimport time\ntime.sleep(120)\n"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=env, start_new_session=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == b"ready"
        spawned = _descendants(child.pid)
        assert len(spawned) >= 2  # the forkserver (or spawn's tracker) and at least one worker
        child.kill()
        child.wait(10)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(_running(p) for p in spawned):
            time.sleep(0.1)
        left = sorted(p for p in spawned if _running(p))
    finally:
        if child.poll() is None:
            child.kill()
    for pid in left:  # clean up after a failure: never leave them behind
        os.kill(pid, signal.SIGKILL)
    assert left == [], f"processes of the killed run still running: {left}"


def _pool_of(results: object) -> object:
    """The ProcessPoolExecutor of a pool generator that has yielded once (a test's only way in)."""
    return results.gi_frame.f_locals["pool"]  # type: ignore[attr-defined]


def _kill_workers_after_first(results: object) -> WorkerError:
    """Take one result of a pool generator, SIGKILL every worker of its pool, read on: the coded error raised."""
    next(results)  # type: ignore[call-overload]
    for pid in list(_pool_of(results)._processes):  # type: ignore[attr-defined]
        os.kill(pid, signal.SIGKILL)
    with pytest.raises(WorkerError) as caught:
        list(results)  # type: ignore[call-overload]
    return caught.value


def test_a_killed_baseline_worker_is_one_coded_error() -> None:
    error = _kill_workers_after_first(classify_many(iter(_items(300)), workers=2, task_segments=3))
    assert error.code == "E140"
    assert "run the same command again" in str(error)


def test_a_killed_segment_worker_is_one_coded_error() -> None:
    items = [(f"t{i}", "So x = 4. Wait, that is wrong. Let me redo it. " * 10) for i in range(300)]
    error = _kill_workers_after_first(segment_spans_many(iter(items), segmenter=Segmenter(), workers=2, task_chars=400))
    assert error.code == "E140"


def test_huge_workers_start_no_more_processes_than_cores_and_give_the_serial_labels() -> None:
    items = _items(60)
    serial = list(classify_many(iter(items), workers=1))
    results = classify_many(iter(items), workers=10**6, task_segments=3)
    first = next(results)
    assert _pool_of(results)._max_workers <= max(2, default_workers())  # type: ignore[attr-defined]
    assert [first, *results] == serial


def test_an_interrupt_during_a_worker_start_is_raised_after_it() -> None:
    """A SIGTERM inside the block reaches the installed handler only when the block is done."""
    steps: list[str] = []

    def handler(signum: int, frame: object) -> None:
        steps.append("handler")
        raise KeyboardInterrupt()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            with interrupts_deferred():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)  # a signal is handled between bytecodes: this is where it would land
                steps.append("block done")
        assert steps == ["block done", "handler"]
        assert signal.getsignal(signal.SIGTERM) is handler
    finally:
        signal.signal(signal.SIGTERM, previous)
