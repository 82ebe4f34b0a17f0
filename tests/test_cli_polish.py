"""The command line as a newcomer meets it: --version, one-line usage errors, flags shown as flags,
one option name per concept, progress callbacks, and a fast, explained failure without the hub.

Expected values come from pyproject.toml (the version), from hand-written inputs (counts) and from
click's own command tree (which options are flags); never from the code under test.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ror_annotate.export import export_dataset, load_export
from ror_annotate.traces import load_traces

from . import review_fixtures as F

runner = CliRunner()
ROR = [sys.executable, "-c", "from ror_annotate.cli import app; app(prog_name='ror')"]
REPO = Path(__file__).resolve().parents[1]


def _app():
    from ror_annotate.cli import app

    return app


@pytest.fixture(autouse=True)
def _wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")


def _one_line_usage_error(result) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "╭" not in result.output  # no rich error box
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error [E010]: "), result.stderr
    return lines[0]


def test_version_is_the_project_version() -> None:
    import re

    version = re.search(r'^version = "([^"]+)"$', (REPO / "pyproject.toml").read_text(encoding="utf-8"), re.M).group(1)
    result = runner.invoke(_app(), ["--version"])
    assert result.exit_code == 0 and result.stdout.strip() == f"ror_annotate {version}"


@pytest.mark.parametrize(
    "args, needles",
    [
        (["run", "--bogus"], ["No such option", "--bogus", "`ror run --help`"]),  # click words it per version
        (["export"], ["Missing argument", "`ror export --help`"]),
        (["--bogus"], ["No such option", "--bogus"]),
        (["nosuch"], ["No such command 'nosuch'"]),
        (["run", "--limit", "0"], ["--limit"]),
        (["label", "--mode", "bogus"], ["'bogus' is not one of 'chunked', 'per-segment'"]),
        (["run", "--chat-template=yes"], ["--chat-template", "does not take a value"]),
        (["review", "create", "--bogus"], ["No such option", "--bogus", "`ror review create --help`"]),
    ],
)
def test_usage_errors_are_one_line_with_a_code(args: list[str], needles: list[str]) -> None:
    line = _one_line_usage_error(runner.invoke(_app(), args))
    for needle in needles:
        assert needle in line


def test_no_arguments_still_prints_the_help() -> None:
    result = runner.invoke(_app(), [])
    assert "Usage: ror" in result.output and "error [" not in result.output


def _commands(group, path=("ror",)):
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):
            yield from _commands(cmd, (*path, name))
        else:
            yield (*path, name), cmd


def test_every_flag_is_shown_without_a_value_placeholder() -> None:
    import typer.main

    group = typer.main.get_command(_app())
    seen_flags = 0
    for path, cmd in [(("ror",), group), *_commands(group)]:
        result = runner.invoke(_app(), [*path[1:], "--help"])
        assert result.exit_code == 0, result.output
        assert "<bool>" not in result.output, path
        flags = [p for p in cmd.params if getattr(p, "is_flag", False) and not getattr(p, "hidden", False)]
        for p in flags:  # each flag is still listed
            assert p.opts[0] in result.output, (path, p.opts)
        seen_flags += len(flags)
    assert seen_flags >= 10  # --chat-template, --force, --stats, --skip-invalid, --sample, --json, --blind ...


def test_split_and_seed_have_one_name_per_concept() -> None:
    run_help = runner.invoke(_app(), ["run", "--help"]).output
    export_help = runner.invoke(_app(), ["export", "--help"]).output
    for flag in ("--split-fractions", "--split-seed"):
        assert flag in run_help and flag in export_help
    assert "Split of a Hugging Face dataset" in run_help  # --split: the hub split
    assert "--split " not in export_help and "--seed " not in export_help  # old spellings: hidden


def _segments_by_split(out: Path) -> dict[str, set[str]]:
    return {name: set(split["trace_id"]) for name, split in load_export(out, "segments").items() if len(split)}


def test_export_split_options_and_their_deprecated_aliases(tmp_path: Path) -> None:
    F.make_store(tmp_path / "s.duckdb").close()
    all_ids = {tid for tid, *_ in F.TRACES}
    new = runner.invoke(_app(), ["export", "d", "--out", str(tmp_path / "new"), "--split-fractions", "1,0,0",
                                 "--split-seed", "3", "--db", str(tmp_path / "s.duckdb")])
    assert new.exit_code == 0, new.output
    assert _segments_by_split(tmp_path / "new") == {"train": all_ids}
    old = runner.invoke(_app(), ["export", "d", "--out", str(tmp_path / "old"), "--split", "0,0,1", "--seed", "3",
                                 "--db", str(tmp_path / "s.duckdb")])
    assert old.exit_code == 0, old.output
    assert _segments_by_split(tmp_path / "old") == {"test": all_ids}
    assert "--split is deprecated here; use --split-fractions" in old.stderr
    assert "--seed is deprecated here; use --split-seed" in old.stderr
    bad = runner.invoke(_app(), ["export", "d", "--split-fractions", "0.5,0.5", "--db", str(tmp_path / "s.duckdb")])
    assert bad.exit_code == 2 and "--split-fractions '0.5,0.5'" in bad.stderr


def test_export_reports_progress_per_batch(tmp_path: Path) -> None:
    calls: list[tuple[int, int]] = []
    with F.make_store(tmp_path / "s.duckdb") as store:
        export_dataset(store, tmp_path / "o", batch_size=2, progress=lambda done, total: calls.append((done, total)))
    n = len(F.TRACES)
    expected = [(min(k, n), n) for k in range(2, n + 2, 2)]  # one call per batch of 2
    assert calls == expected


def test_load_traces_reports_progress_per_record(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"id": f"t{i}", "trace": f"Step {i}."}) + "\n" for i in range(5)), encoding="utf-8")
    calls: list[tuple[int, int | None]] = []
    load_traces(path, progress=lambda n, total: calls.append((n, total)))
    assert calls == [(1, None), (2, None), (3, None), (4, None), (5, None)]
    calls.clear()
    load_traces(path, limit=2, progress=lambda n, total: calls.append((n, total)))
    assert calls == [(1, 2), (2, 2)]


# ----------------------------------------------------------------------------- no hub
def _closed_port() -> int:
    with socket.socket() as s:  # bound then closed: nothing listens there afterwards
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ror(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "ROR_DB")}
    full.update({"COLUMNS": "200", "NO_COLOR": "1", **env})
    return subprocess.run([*ROR, *args], cwd=cwd, capture_output=True, text=True, env=full, timeout=300)


def test_unreachable_hub_fails_at_once_with_a_hint(tmp_path: Path) -> None:
    done = _ror("ingest", "some-org/some-traces", "--db", "s.duckdb", cwd=tmp_path, HF_ENDPOINT=f"http://127.0.0.1:{_closed_port()}")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("error [")]  # the ingest bar may precede it
    assert len(lines) == 1 and lines[0].startswith("error [E210]: some-org/some-traces: the Hugging Face hub"), done.stderr
    assert "cannot be reached" in lines[0] and "embedded sample" in lines[0] and "HF_HUB_OFFLINE=1" in lines[0]
    assert "Retrying" not in done.stderr and "thrown while requesting" not in done.stderr


def test_offline_mode_failure_points_to_the_sample(tmp_path: Path) -> None:
    done = _ror("run", "--preset", "s1k", "--db", "s.duckdb", cwd=tmp_path, HF_HUB_OFFLINE="1",
                HF_HOME=str(tmp_path / "hf"))  # an empty cache: the dataset cannot be there
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("error [")]
    assert done.returncode == 2 and len(errors) == 1 and errors[0].startswith("error [E100]: simplescaling/s1K"), done.stderr
    assert "embedded sample" in errors[0] and "Traceback" not in done.stderr


def test_python_dash_m_runs_the_cli() -> None:
    import subprocess
    import sys

    for module in ("ror_annotate", "ror_annotate.cli"):
        done = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and done.stdout.startswith("ror_annotate "), (module, done.stderr)
