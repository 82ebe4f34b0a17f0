"""What a new user runs into: wrong options, typos, secrets in URLs, odd files, interrupted runs.

Each test replays one mistake found by trying the finished commands as a researcher would. The
contract checked everywhere: a user mistake is ONE line ``error [CODE]: ...`` on stderr, exit
status 2, no traceback, and the store is left as it was.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ror_annotate.records import Label
from ror_annotate.store import Store, scrub_secrets
from ror_annotate.traces import load_traces

from .judge_fixtures import TRACE_A, build_store
from .openai_server import FakeOpenAI

runner = CliRunner()
ROR = [sys.executable, "-c", "from ror_annotate.cli import app; app(prog_name='ror')"]


def _app():
    from ror_annotate.cli import app

    return app


def _one_error_line(result, code: str) -> str:
    """The single ``error [CODE]: ...`` line of a failed command (asserts the whole contract)."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error [")]
    assert len(errors) == 1 and errors[0].startswith(f"error [{code}]: "), result.stderr
    return errors[0]


@pytest.fixture(autouse=True)
def _no_real_key(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.setenv("COLUMNS", "200")


# ---------------------------------------------------------------------------------------- options
def test_bad_mode_choice_is_a_usage_error_not_a_traceback(tmp_path: Path) -> None:
    # judge_options raised click.BadParameter, which typer's vendored click does not know.
    result = runner.invoke(_app(), ["label", "--mode", "bogus", "--db", str(tmp_path / "s.duckdb")])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "'bogus' is not one of 'chunked', 'per-segment'" in result.output


def test_label_unknown_trace_id_is_an_error(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    build_store(db, {"a": ("Add.", TRACE_A)}).close()
    result = runner.invoke(_app(), ["label", "--trace", "nosuch", "--db", str(db)])
    line = _one_error_line(result, "E100")
    assert "'nosuch'" in line
    with Store(db) as store:
        assert store.counts()["labels"] == 0


def test_run_checks_the_judge_before_reading_anything(tmp_path: Path, real_traces_path: Path) -> None:
    # Without a key for a remote judge, `ror run` used to ingest and segment everything first.
    db = tmp_path / "s.duckdb"
    result = runner.invoke(_app(), ["run", str(real_traces_path), "--limit", "2", "--judge", "openai:gpt-4.1-mini", "--db", str(db)])
    assert "OPENAI_API_KEY" in _one_error_line(result, "E110")
    with Store(db) as store:
        assert store.counts()["traces"] == 0


def test_label_with_missing_key_prints_only_the_error_line(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    build_store(db, {"a": ("Add.", TRACE_A)}).close()
    result = runner.invoke(_app(), ["label", "--judge", "openai:gpt-4.1-mini", "--db", str(db)])
    _one_error_line(result, "E110")
    assert result.stderr.startswith("error [E110]"), repr(result.stderr)  # no empty progress bar first


def test_base_url_must_be_an_http_url(tmp_path: Path, monkeypatch) -> None:
    from ror_annotate.errors import ConfigError
    from ror_annotate.judge import make_judge

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    for url in ("notaurl", "127.0.0.1:8000/v1", "ftp://host/v1"):
        with pytest.raises(ConfigError, match="--base-url"):
            make_judge("openai:m", base_url=url)


def test_unreachable_endpoint_aborts_instead_of_failing_every_segment(tmp_path: Path) -> None:
    from ror_annotate.errors import JudgeError
    from ror_annotate.judge import make_judge

    async def no_sleep(_seconds: float) -> None:
        return None

    store = build_store(tmp_path / "s.duckdb", {"a": ("Add.", TRACE_A), "b": ("Add.", TRACE_A + " Done.")})
    judge = make_judge("openai:m", base_url="http://127.0.0.1:9/v1", max_attempts=2, sleep=no_sleep)
    with pytest.raises(JudgeError, match=r"cannot reach http://127\.0\.0\.1:9/v1"):
        judge.label(store, ["a", "b"])
    assert store.execute("SELECT count(*) FROM judge_failures").fetchone()[0] == 0
    store.close()


# ---------------------------------------------------------------------------------------- secrets
def test_secrets_inside_urls_are_scrubbed(tmp_path: Path) -> None:
    params = {
        "base_url": "http://user:sk-URLSECRET999@127.0.0.1:8000/v1",
        "other": "https://proxy.example.org/v1?api-key=sk-QUERY77&region=eu",
        "source": "/data/traces.jsonl",
    }
    clean = scrub_secrets(params)
    text = json.dumps(clean)
    assert "URLSECRET" not in text and "QUERY77" not in text
    assert "127.0.0.1:8000/v1" in clean["base_url"] and "region=eu" in clean["other"]
    assert clean["source"] == "/data/traces.jsonl"
    with Store(tmp_path / "s.duckdb") as store:
        run = store.start_run("label", params)
        store.finish_run(run.run_id)
        store.execute("CHECKPOINT")
    assert b"URLSECRET" not in (tmp_path / "s.duckdb").read_bytes()


# ---------------------------------------------------------------------------------------- inputs
def test_utf8_bom_is_accepted_in_jsonl_and_json(tmp_path: Path) -> None:
    jl = tmp_path / "bom.jsonl"
    jl.write_bytes(b"\xef\xbb\xbf" + b'{"id": "a", "trace": "one. two."}\n{"id": "b", "trace": "three."}\n')
    arr = tmp_path / "bom.json"
    arr.write_bytes(b"\xef\xbb\xbf" + b'[{"id": "a", "trace": "one. two."}]')
    assert [t.trace_id for t in load_traces(jl).traces] == ["a", "b"]
    assert [t.trace_id for t in load_traces(arr).traces] == ["a"]


def test_non_finite_numbers_do_not_reach_meta_as_invalid_json(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "odd.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "trace": ["one. two.", "three."], "score": [1.5, float("nan")]}), path)
    traces = load_traces(path).traces
    assert traces[0].meta == {"score": 1.5} and traces[1].meta == {}
    with Store(tmp_path / "s.duckdb") as store:
        store.upsert_traces(traces)
        raw = [r[0] for r in store.execute("SELECT meta FROM traces ORDER BY trace_id").fetchall()]
    assert [json.loads(r, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}")) for r in raw] == [{"score": 1.5}, {}]


# ---------------------------------------------------------------------------------------- store
def test_read_only_commands_do_not_create_a_store_on_a_typo(tmp_path: Path) -> None:
    typo = tmp_path / "nope" / "typo.duckdb"
    for args in (["status"], ["agree"]):
        result = runner.invoke(_app(), [*args, "--db", str(typo)])
        assert str(typo) in _one_error_line(result, "E200")
    assert not typo.exists() and not typo.parent.exists()


def test_multi_line_messages_are_printed_on_one_line(tmp_path: Path) -> None:
    import typer

    from ror_annotate.cli.app import RorGroup
    from ror_annotate.errors import ConfigError

    demo = typer.Typer(cls=RorGroup)

    @demo.command()
    def boom() -> None:
        raise ConfigError("cannot load tokenizer 'x': OSError: no network.\nCheck your connection.. Give a path")

    @demo.command()
    def other() -> None:
        pass

    result = runner.invoke(demo, ["boom"])
    line = _one_error_line(result, "E110")
    assert line.endswith("no network. Check your connection.. Give a path")


def test_killed_run_shows_as_abandoned_in_status(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    with Store(db) as store:
        store.start_run("label", {"judge": "openai:m"})  # never finished: its process was killed
    result = runner.invoke(_app(), ["status", "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert "abandoned" in result.stdout and "running" not in result.stdout


def test_ctrl_c_says_what_was_kept(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    build_store(db, {f"t{i}": ("Add.", TRACE_A + f" Step {i}.") for i in range(40)}).close()
    with FakeOpenAI(latency=0.3) as srv:
        env = {**os.environ, "COLUMNS": "200"}
        child = subprocess.Popen(
            [*ROR, "label", "--judge", "openai:m", "--base-url", srv.base_url, "--db", str(db), "--concurrency", "1"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        deadline = time.monotonic() + 60
        while len(srv.chat_requests()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=60)
    assert child.returncode == 130
    assert "Traceback" not in err
    assert "interrupted" in err and "again to resume" in err
    with Store(db) as store:
        assert [r.status for r in store.runs()] == ["interrupted"]
        kept = store.counts()["labels"]
    assert 0 < kept < 40 * 7


# ---------------------------------------------------------------------------------------- agree --from-csv
def test_csv_that_is_not_utf8_is_one_error_line_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.csv"
    path.write_bytes(b"item_id,annotator,label\n1,a,planning\n1,b,planning\n2,a,fact\n2,b,r\xe9flexion\n")
    result = runner.invoke(_app(), ["agree", "--from-csv", str(path), "--resamples", "0"])
    assert f"{path}: line 5: " in _one_error_line(result, "E100")


def test_csv_with_a_long_free_text_column_is_read(tmp_path: Path) -> None:
    # Exports that carry the segment or trace text exceed csv's default 131,072-character field limit.
    path = tmp_path / "long.csv"
    long_text = "x" * 200_000
    path.write_text(
        "item_id,annotator,label,text\n"
        f"1,a,planning,{long_text}\n1,b,planning,{long_text}\n2,a,fact,y\n2,b,execution,y\n",
        encoding="utf-8",
    )
    result = runner.invoke(_app(), ["agree", "--from-csv", str(path), "--resamples", "0", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["percent_agreement"]["value"] == 0.5  # hand count: 1 of 2 items agree


def test_agreement_report_into_an_unwritable_place_is_one_error_line(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text("item_id,annotator,label\n1,a,planning\n1,b,planning\n2,a,fact\n2,b,execution\n", encoding="utf-8")
    blocker = tmp_path / "taken"
    blocker.write_text("a file where the report folder should go", encoding="utf-8")
    result = runner.invoke(_app(), ["agree", "--from-csv", str(path), "--resamples", "0", "--report", str(blocker / "report")])
    assert str(blocker / "report") in _one_error_line(result, "E810")


def test_baseline_rerun_changes_nothing(tmp_path: Path) -> None:
    # README: "Every stage is idempotent: running it again on the same input changes nothing."
    from ror_annotate.judge import make_judge

    store = build_store(tmp_path / "s.duckdb", {"a": ("Add.", TRACE_A)})
    judge = make_judge("baseline")
    first = judge.label(store, ["a"], run=store.start_run("label", {}))
    before = store.execute("SELECT * FROM labels ORDER BY segment_index").fetchall()
    second = judge.label(store, ["a"], run=store.start_run("label", {}))
    after = store.execute("SELECT * FROM labels ORDER BY segment_index").fetchall()
    store.close()
    assert first.labeled == 6 and (second.labeled, second.skipped) == (0, 6)  # TRACE_A has 6 sentences
    assert after == before  # same run_id and created_at: the provenance of the first pass stands


def test_status_at_80_columns_shows_whole_annotator_names_and_run_ids(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    store = build_store(db, {"a": ("Add.", TRACE_A)})
    run = store.start_run("label", {})
    store.upsert_labels([
        Label(trace_id="a", segment_index=i, label="fact", source=src, annotator=ann, codebook_version="cb")
        for i in range(2) for src, ann in (("judge", "openai:gpt-4.1-mini"), ("baseline", "baseline:cue-v1"))
    ])
    store.finish_run(run.run_id, counts={"labeled": 4})
    store.close()
    env = {**os.environ, "COLUMNS": "80", "NO_COLOR": "1"}
    out = subprocess.run([*ROR, "status", "--db", str(db)], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "openai:gpt-4.1-mini (judge)" in out.stdout and "baseline:cue-v1 (baseline)" in out.stdout
    assert run.run_id in out.stdout and "labeled=4" in out.stdout
    assert max(len(line) for line in out.stdout.splitlines()) <= 80
