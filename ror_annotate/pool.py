"""What the process pools of the CPU stages share (the segmenter's and the baseline rules').

Both run :class:`concurrent.futures.ProcessPoolExecutor` with forkserver (else spawn) workers. This
module keeps three promises for them, whichever pool it is:

* a worker outlives its parent by well under a second (:func:`init_worker`): after ``kill -9`` of the
  ``ror`` process nothing of it is left running (by itself an idle worker waits for work forever, and
  holds the forkserver and the resource tracker alive with it);
* an interrupt (Ctrl-C, SIGTERM) that arrives while a worker is being started is handled once the
  start is complete (:func:`interrupts_deferred`), so the pool's shutdown knows that worker (a worker
  half started when the parent cleans up prints a traceback of its own);
* a worker that dies while the pool runs is one coded line, :class:`~ror_annotate.errors.WorkerError`
  (``E140``), not a ``BrokenProcessPool`` traceback (:func:`submit`, :func:`result`).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .errors import WorkerError

_INTERRUPTS = tuple(s for s in (getattr(signal, "SIGINT", None), getattr(signal, "SIGTERM", None)) if s is not None)


def max_workers(workers: int) -> int:
    """``workers`` capped at the cores this process may use (at least 2, so a pool can be tried).

    More processes than cores cannot run the CPU-bound rules faster, and each costs its memory and its
    ``4 * workers`` tasks of read-ahead (``--workers 100000`` would otherwise read the whole corpus
    ahead and start one process per task).
    """
    from .segment import default_workers

    return min(workers, max(2, default_workers()))


def init_worker() -> None:
    """Run first in every worker: ignore Ctrl-C (the parent handles it) and exit with the parent.

    The exit: a daemon thread waits on :func:`multiprocessing.parent_process`'s sentinel, which
    becomes ready when the parent process ends however it ended (the write end of a pipe only the
    parent holds, closed by the kernel), then ends this process with :func:`os._exit`.
    """
    import multiprocessing

    from .gc_policy import set_for_process

    set_for_process()  # our own process: fewer collections (gc_policy)
    if hasattr(signal, "SIGINT"):
        # Ctrl-C reaches the whole process group: only the parent handles it (it stops the pool and
        # records the interruption); a worker dying of it would turn it into a BrokenProcessPool.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_exit_with_parent, args=(parent.sentinel,), name="ror-parent-watch", daemon=True).start()


def _exit_with_parent(sentinel: Any) -> None:
    from multiprocessing.connection import wait

    wait([sentinel])
    os._exit(1)


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM for the duration of the block, then act on the first one caught.

    Only in the main thread (elsewhere the block runs as is). The held signal is then handed to the
    handler that was installed before the block (``ror``'s: ``KeyboardInterrupt``); a default SIGINT
    raises ``KeyboardInterrupt``, a default SIGTERM is re-sent to this process; an ignored one is dropped.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []

    def hold(signum: int, frame: Any) -> None:
        caught.append(signum)

    previous = {s: signal.signal(s, hold) for s in _INTERRUPTS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if caught:
            signum = caught[0]
            handler = previous[signum]
            if callable(handler):
                handler(signum, None)
            elif handler != signal.SIG_IGN:
                if signum == getattr(signal, "SIGINT", None):
                    raise KeyboardInterrupt()
                os.kill(os.getpid(), signum)


def submit(pool: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """``pool.submit(fn, *args)`` with interrupts deferred (it may start a worker), E140 if the pool broke."""
    from concurrent.futures.process import BrokenProcessPool

    try:
        with interrupts_deferred():
            return pool.submit(fn, *args)
    except BrokenProcessPool as exc:
        raise _worker_died() from exc


def result(future: Any) -> Any:
    """``future.result()``; :class:`~ror_annotate.errors.WorkerError` (E140) if its worker died."""
    from concurrent.futures.process import BrokenProcessPool

    try:
        return future.result()
    except BrokenProcessPool as exc:
        raise _worker_died() from exc


def _worker_died() -> WorkerError:
    hint = ""
    if _running_a_script():
        hint = ("; a script that calls ror_annotate must run it under `if __name__ == \"__main__\":` (worker processes "
                "import the script again: E141 above)")
    return WorkerError(
        "a worker process ended abruptly (killed, or out of memory) while this command ran; everything committed before it "
        f"is stored: run the same command again to resume (with --workers 1 to run without worker processes){hint}"
    )


def _running_a_script() -> bool:
    """Whether ``__main__`` is a user's script file (not ``ror``, ``python -m ror_annotate``, ``-c`` or a REPL)."""
    import sys

    path = getattr(sys.modules.get("__main__"), "__file__", None)
    return bool(path) and "ror_annotate" not in str(path).replace("\\", "/") and os.path.basename(str(path)) != "ror"


#: Code of a store opened while a worker process imports the user's script (no main guard).
UNGUARDED_SCRIPT = "E141"


def refuse_in_worker_bootstrap() -> None:
    """End a worker process that is importing the user's script and reached ror_annotate's work.

    Worker processes (forkserver, spawn) import the ``__main__`` script again before they run
    anything (Python's multiprocessing). A script that runs the pipeline at its top level, without
    ``if __name__ == "__main__":`` (as the README's Python example did), ran it again in every
    worker: each waited 10 s on the store's lock, failed with a traceback, and the parent reported a
    worker "killed, or out of memory" (E140). Called where a store is opened; it prints one coded
    line (``E141``) and exits the worker (:class:`SystemExit`, status 2) without a traceback.
    Outside a worker's start-up it does nothing.
    """
    import multiprocessing.process
    import sys

    if getattr(multiprocessing.process.current_process(), "_inheriting", False):
        sys.stderr.write(
            f"error [{UNGUARDED_SCRIPT}]: a worker process started by ror_annotate imported your script "
            f"{getattr(sys.modules.get('__mp_main__') or sys.modules.get('__main__'), '__file__', None) or ''} again and reached its pipeline code: put the code that "
            "runs ror_annotate under `if __name__ == \"__main__\":` (worker processes import the main script; "
            "https://docs.python.org/3/library/multiprocessing.html#the-spawn-and-forkserver-start-methods)\n"
        )
        sys.stderr.flush()
        raise SystemExit(2)
