"""Faults found by using the product as an attacker would (issue 27's spirit, round 6), each kept as a test.

Each test failed before its fix. Expected values come from the documented contract (a coded one-line
error, exit 130 with the one ``interrupted:`` line) or from the ``openai`` client's own path, never
from the code under test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ror_annotate.errors import ConfigError
from ror_annotate.records import Segment, Trace
from ror_annotate.review import flow
from ror_annotate.review.adjudicate import adjudicate_study, check_adjudicator, set_adjudicator
from ror_annotate.review.studies import create_study, load_study
from ror_annotate.store import Store


# ----------------------------------------------------------------------------- adjudication is independent
def _study_store(tmp_path: Path) -> Store:
    text = "So x = 4. Wait, that is wrong."
    store = Store(tmp_path / "s.duckdb")
    store.upsert_traces([Trace(trace_id="t-1", text=text)])
    store.replace_segments("t-1", [Segment(trace_id="t-1", segment_index=0, char_start=0, char_end=9, text=text[:9], n_tokens=2),
                                   Segment(trace_id="t-1", segment_index=1, char_start=9, char_end=len(text), text=text[9:], n_tokens=2)],
                           segmenter="hand", token_counter="chars/4")
    return store


@pytest.mark.parametrize("given", ["ann1@lab.org", " ANN1@Lab.org "])
def test_an_annotator_of_the_study_is_refused_as_its_adjudicator(tmp_path: Path, given: str) -> None:
    store = _study_store(tmp_path)
    create_study(store, "pilot-1", annotators=["ann1@lab.org", "ann2@lab.org"], strategy="random", n=2, overlap=2)
    for attempt in (check_adjudicator, set_adjudicator):
        with pytest.raises(ConfigError, match=r"^adjudicator 'ann1@lab\.org' is also an annotator of study 'pilot-1'.*--adjudicator") as info:
            attempt(store, "pilot-1", given)
        assert info.value.code == "E775"
    with pytest.raises(ConfigError, match="is also an annotator") as info:
        flow.adjudicator_account(store, "pilot-1", object(), given)  # type: ignore[arg-type]  # refused before any server call
    assert not load_study(store, "pilot-1").adjudicator
    assert set_adjudicator(store, "pilot-1", "adj@lab.org")  # someone else is fine
    store.close()


def test_a_new_study_whose_adjudicator_is_one_of_its_annotators_is_refused_before_anything_is_stored(tmp_path: Path) -> None:
    store = _study_store(tmp_path)
    with pytest.raises(ConfigError, match="is also an annotator") as info:
        create_study(store, "pilot-1", annotators=["ann1@lab.org", "ann2@lab.org"], strategy="random", n=2, overlap=2,
                     adjudicator="Ann2@lab.org")
    assert info.value.code == "E775"
    assert store.execute("SELECT count(*) FROM review_studies").fetchone() == (0,)
    with pytest.raises(ConfigError, match="is also an annotator"):
        # review start checks before it starts or reaches a server (client=None would start one)
        flow.review_start(store, "pilot-2", annotators=["ann1@lab.org", "ann2@lab.org"], adjudicator="ann1@lab.org", n=2, overlap=2,
                          strategy="random")
    store.close()


def test_a_study_stored_with_an_annotator_as_adjudicator_cannot_be_adjudicated(tmp_path: Path) -> None:
    store = _study_store(tmp_path)
    create_study(store, "pilot-1", annotators=["ann1@lab.org", "ann2@lab.org"], strategy="random", n=2, overlap=2)
    pseudonym = store.execute("SELECT pseudonym FROM review_people WHERE email = 'ann1@lab.org'").fetchone()[0]
    store.execute("UPDATE review_studies SET adjudicator = ? WHERE name = 'pilot-1'", [pseudonym])  # as before the check
    with pytest.raises(ConfigError, match=r"adjudicator 'ann1@lab\.org' is also an annotator") as info:
        adjudicate_study(store, "pilot-1", object())  # type: ignore[arg-type]
    assert info.value.code == "E775"
    store.close()


# ----------------------------------------------------------------------------- interrupts are never lost
@pytest.fixture
def sigterm_as_interrupt():
    """SIGTERM raises KeyboardInterrupt, as the ``ror`` command sets it up (cli/app.py)."""
    import signal

    def handler(signum, frame):
        raise KeyboardInterrupt()

    before = signal.signal(signal.SIGTERM, handler)
    yield
    signal.signal(signal.SIGTERM, before)


def test_a_sigterm_while_a_finished_run_is_recorded_still_stops_the_command(tmp_path: Path, sigterm_as_interrupt, monkeypatch) -> None:
    import os
    import signal

    store = Store(tmp_path / "s.duckdb")
    finish = store.finish_run

    def finish_then_signal(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # lands inside the block that records the run
        return finish(*args, **kwargs)

    monkeypatch.setattr(store, "finish_run", finish_then_signal)
    with pytest.raises(KeyboardInterrupt):  # was: ignored, and the next stage of `ror run` went on
        with store.run("segment"):
            pass
    monkeypatch.undo()
    assert store.execute("SELECT status FROM runs").fetchall() == [("ok",)]  # recorded completely first
    store.close()


_SELF_SIGNAL = """
import os, signal, sys, time
sys.argv = [{argv0!r}, "status"]
import ror_annotate.cli  # what the `ror` script and `python -m ror_annotate` import first
os.kill(os.getpid(), signal.{sig})  # lands before the command runs (its modules take about a second)
time.sleep(10)
"""


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("argv0", ["/venv/bin/ror", "/src/ror_annotate/__main__.py"])
def test_an_interrupt_while_ror_starts_is_the_one_line_and_130(sig: str, argv0: str) -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _SELF_SIGNAL.format(argv0=argv0, sig=sig)], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (130, "interrupted: everything finished before Ctrl-C is stored; run the same command again to resume\n")


def test_a_program_that_imports_the_cli_keeps_its_own_signal_handlers() -> None:
    import subprocess
    import sys

    code = "import signal, ror_annotate.cli; print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["True", "True"], done.stderr
