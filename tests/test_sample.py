"""The embedded sample (40 MIT-licensed thought-anchors traces) and the first run a newcomer makes.

Expected counts come from shared/data/README.md (40 thought-anchors traces, MIT, "Copyright (c)
2025 interp-reasoning") and from the sample file itself read with plain ``json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ror_annotate.errors import ConfigError, InputError
from ror_annotate.sample import (
    card_license,
    resolve_source,
    sample_path,
    sample_records,
)
from ror_annotate.traces import load_traces

from .conftest import DATA, PITFALLS, SHARED_PITFALLS

ROR = [sys.executable, "-c", "from ror_annotate.cli import app; app(prog_name='ror')"]


def ror(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    # no hub, whatever the machine: the sample must need nothing from the network
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "HF_HUB_OFFLINE": "1"}
    env.pop("ROR_DB", None)
    return subprocess.run([*ROR, *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=600)


def test_sample_holds_only_the_mit_licensed_traces_with_their_licence() -> None:
    path = sample_path()
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 40 and len({r["trace_id"] for r in rows}) == 40
    # the other sources have no licence and must never be embedded
    assert all(r["trace_id"].startswith("thought-anchors:") for r in rows)
    assert {r["source_repo"] for r in rows} == {"interp-reasoning/thought-anchors.com"}
    licence = (path.parent / "LICENSE-thought-anchors").read_text(encoding="utf-8")
    assert licence.startswith("MIT License") and "Copyright (c) 2025 interp-reasoning" in licence
    attribution = (path.parent / "README.md").read_text(encoding="utf-8")
    assert "interp-reasoning/thought-anchors.com" in attribution and "LICENSE-thought-anchors" in attribution
    assert sample_records() == rows


def test_sample_loads_as_traces_equal_to_the_file() -> None:
    rows = sample_records()
    traces = load_traces(sample_path()).traces
    assert [t.trace_id for t in traces] == [r["trace_id"] for r in rows]
    for t, r in zip(traces, rows):
        assert t.text == r["trace"] and t.problem == r["problem"] and t.model == r["model"]
        assert t.gold_answer == r["gold_answer"] and t.correct is r["correct"] and t.dataset == r["benchmark"]


def test_resolve_source_rules() -> None:
    sample = str(sample_path())
    assert resolve_source("", None, sample=False, default_to_sample=True) == sample
    assert resolve_source("", None, sample=True, default_to_sample=False) == sample
    assert resolve_source("x.jsonl", None, sample=False, default_to_sample=True) == "x.jsonl"
    assert resolve_source("", "s1k", sample=False, default_to_sample=True) == ""  # the preset names its dataset
    with pytest.raises(InputError, match="--sample"):
        resolve_source("", None, sample=False, default_to_sample=False)
    with pytest.raises(ConfigError, match="either --sample or an input"):
        resolve_source("x.jsonl", None, sample=True, default_to_sample=True)
    with pytest.raises(ConfigError, match="--preset"):
        resolve_source("", "s1k", sample=True, default_to_sample=True)
    assert card_license(sample) == "mit" and card_license("x.jsonl") == "other"


def test_ror_run_without_input_runs_the_main_job_on_the_sample_offline(tmp_path: Path) -> None:
    import datasets

    done = ror("run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert "40 (40 new, 0 skipped as invalid)" in done.stdout
    export = tmp_path / "exports" / "sample_traces"
    ds = datasets.load_from_disk(str(export / "segments"))
    assert {tid for split in ds.values() for tid in split["trace_id"]} == {r["trace_id"] for r in sample_records()}
    assert "license: mit" in (export / "README.md").read_text(encoding="utf-8")
    assert (tmp_path / "ror.duckdb").is_file()
    # --sample says the same explicitly; the second run finds everything stored
    again = ror("run", "--sample", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "40 (0 new, 0 skipped as invalid)" in again.stdout


def test_ror_ingest_needs_an_input_or_sample(tmp_path: Path) -> None:
    missing = ror("ingest", cwd=tmp_path)
    assert missing.returncode == 2 and missing.stderr.startswith("error [E100]: no input") and "--sample" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
    both = ror("ingest", "x.jsonl", "--sample", cwd=tmp_path)
    assert both.returncode == 2 and both.stderr.startswith("error [E110]")
    done = ror("ingest", "--sample", "--db", "s.duckdb", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "traces: 40 new, 0 already stored, 0 skipped" in done.stdout


# ----------------------------------------------------------------------------- shared tier
@pytest.mark.shared
def test_sample_is_byte_identical_to_the_thought_anchors_lines_of_shared_data() -> None:
    lines = (DATA / "traces.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    wanted = [line for line in lines if json.loads(line)["trace_id"].startswith("thought-anchors:")]
    assert sample_path().read_text(encoding="utf-8").splitlines(keepends=True) == wanted


@pytest.mark.shared
@pytest.mark.parametrize("case", sorted(p.name for p in PITFALLS.glob("*.json")))
def test_pitfall_copies_equal_the_shared_originals(case: str) -> None:
    assert (PITFALLS / case).read_bytes() == (SHARED_PITFALLS / case).read_bytes()


def test_the_samples_export_says_its_text_may_be_published(tmp_path) -> None:
    """The sample is MIT (data/README.md): its export must not list it under 'licence unknown'."""
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", "from ror_annotate.cli import app; app(prog_name='ror')", "run", "--db", "s.duckdb", "--out", "out"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    manifest = (tmp_path / "out" / "ror_export.json").read_text(encoding="utf-8")
    assert "interp-reasoning/thought-anchors.com" in manifest
    assert "licence unknown" not in done.stdout.replace("\n", " ")
    data = json.loads(manifest)
    assert data["parameters"]["license"] == "mit"
    assert data["sources"] == [{"source": "interp-reasoning/thought-anchors.com", "license": "mit", "publishable": True, "n_traces": 40}]
