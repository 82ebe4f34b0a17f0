"""The collector's settings for long runs (ror_annotate/gc_policy.py): a judge run freezes the heap of
before it and raises the young threshold, and restores both after it; nested blocks act once; a
collector switched off stays off; the ``ror`` command's process runs with the raised threshold, a
program that imports the package keeps its own.

Expected values: CPython's gc state read before and after (``gc.get_threshold``,
``gc.get_freeze_count``) and the threshold the module documents (20,000 allocations)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ror_annotate.judge import llm, make_judge

from .judge_fixtures import TRACE_A, TRACE_U, build_store
from .openai_server import FakeOpenAI

# no OPENAI_API_KEY / OPENAI_BASE_URL of the machine reaches a test (conftest.no_openai_env)
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_openai_env")]

MODEL = "gpt-4.1-mini"


def _traces(n: int) -> dict[str, tuple[str, str]]:
    return {f"t{i}": (f"Problem {i}.", TRACE_U if i % 2 else TRACE_A) for i in range(n)}


def test_a_run_collects_garbage_less_often_and_restores_the_collector(tmp_path, monkeypatch):
    """Inside a run (gc_policy.fewer_collections): the objects from before it frozen, the young threshold raised; after it (also
    after a failed run) the thresholds and the frozen count are as before. Nested blocks act once;
    a collector switched off by threshold 0 stays off."""
    import gc

    from ror_annotate.gc_policy import fewer_collections

    seen: list[tuple[tuple[int, int, int], int]] = []
    original = llm.LLMJudge._judge_trace

    async def spy(self, ctx, trace_id, sample):
        seen.append((gc.get_threshold(), gc.get_freeze_count()))
        return await original(self, ctx, trace_id, sample)

    monkeypatch.setattr(llm.LLMJudge, "_judge_trace", spy)
    before = gc.get_threshold()
    frozen_before = gc.get_freeze_count()
    store = build_store(tmp_path / "s.duckdb", _traces(2))
    with FakeOpenAI() as srv:
        make_judge(f"openai:{MODEL}", base_url=srv.base_url).label(store, ["t0", "t1"])
    assert gc.get_threshold() == before and gc.get_freeze_count() == frozen_before
    assert [t for t, _ in seen] == [(max(before[0], 20_000), before[1], before[2])] * 2
    assert all(n > frozen_before for _, n in seen)  # the heap of before the run, frozen

    with fewer_collections():
        with fewer_collections():
            inner = gc.get_threshold()
        assert gc.get_threshold() == inner  # the inner exit left the outer block's settings
    assert gc.get_threshold() == before and gc.get_freeze_count() == frozen_before

    gc.set_threshold(0)
    try:
        with fewer_collections():
            assert gc.get_threshold()[0] == 0
        assert gc.get_threshold()[0] == 0
    finally:
        gc.set_threshold(*before)
    store.close()


@pytest.mark.parametrize("as_command", [True, False])
def test_the_command_process_collects_less_often_a_program_keeps_its_settings(as_command):
    argv0 = "sys.argv[0] = '/somewhere/ror_annotate/__main__.py'; " if as_command else ""
    code = f"import sys, gc; {argv0}import ror_annotate.cli; print(gc.get_threshold()[0])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    bare = subprocess.run([sys.executable, "-c", "import gc; print(gc.get_threshold()[0])"], capture_output=True, text=True,
                          timeout=60, check=True)  # this interpreter's default (700 up to CPython 3.13)
    assert int(out.stdout.strip()) == (max(20_000, int(bare.stdout)) if as_command else int(bare.stdout))


def test_worker_processes_of_our_pools_collect_less_often():
    """pool.init_worker (every worker of the segmenter's pool runs it first) raises the threshold in
    that process."""
    code = "import gc; from ror_annotate.pool import init_worker; init_worker(); print(gc.get_threshold()[0])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    bare = subprocess.run([sys.executable, "-c", "import gc; print(gc.get_threshold()[0])"], capture_output=True, text=True,
                          timeout=60, check=True)
    assert int(out.stdout.strip()) == max(20_000, int(bare.stdout))
