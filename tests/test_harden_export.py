"""Issue 27, export and publishing: a source's licence is kept with the stored traces; `ror publish
--dry-run`; export faults (disk full, read-only folder, a killed export's temporary folder, a
read-only store).

Expected values are written by hand from the inputs next to them.
"""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROR = [sys.executable, "-m", "ror_annotate"]


def _ror(*args: str, cwd: Path, timeout: int = 300, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": os.getcwd(), "HF_HUB_OFFLINE": "1", "COLUMNS": "100", **env}
    return subprocess.run([*ROR, *args], cwd=cwd, capture_output=True, text=True, env=full, timeout=timeout)


@pytest.fixture(scope="module")
def sample_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded sample ingested and segmented (no labels needed for these tests)."""
    d = tmp_path_factory.mktemp("sample")
    for args in (("ingest", "--sample"), ("segment",)):
        out = _ror(*args, "--db", str(d / "s.duckdb"), cwd=d)
        assert out.returncode == 0, out.stderr
    return d / "s.duckdb"


def test_sample_licence_is_kept_with_the_stored_traces(sample_store: Path, tmp_path: Path) -> None:
    out = _ror("export", str(tmp_path / "ds"), "--db", str(sample_store), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    manifest = json.loads((tmp_path / "ds" / "ror_export.json").read_text())
    assert manifest["sources"] == [
        {"source": "interp-reasoning/thought-anchors.com", "license": "mit", "publishable": True, "n_traces": 40}
    ]
    from ror_annotate.export.write import unpublishable_sources

    assert unpublishable_sources(tmp_path / "ds") == []


def test_publish_dry_run_lists_files_and_validates_the_card(sample_store: Path, tmp_path: Path) -> None:
    out = _ror("export", "ds", "--out", str(tmp_path / "ds"), "--db", str(sample_store), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    # no token, no network: the dry run needs neither
    env = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"}
    dry = subprocess.run([*ROR, "publish", str(tmp_path / "ds"), "--repo-id", "org/name", "--dry-run"], cwd=tmp_path,
                         capture_output=True, text=True, env={**env, "PYTHONPATH": os.getcwd(), "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}, timeout=300)
    assert dry.returncode == 0, dry.stderr
    # the files that would go: README.md, analytics.json, data/** (parquet), agreement/** if any; never the save_to_disk copies
    expected = sorted(
        p.relative_to(tmp_path / "ds").as_posix() for p in (tmp_path / "ds").rglob("*")
        if p.is_file() and (p.name in ("README.md", "analytics.json") or p.relative_to(tmp_path / "ds").parts[0] in ("data", "agreement"))
    )
    assert expected and all(p in dry.stdout for p in expected)
    assert "ror_export.json" not in dry.stdout and ".arrow" not in dry.stdout
    total = sum((tmp_path / "ds" / p).stat().st_size for p in expected)
    assert f"total: {len(expected)} files" in dry.stdout and f"{total:,}" in dry.stdout
    assert "card metadata valid (license mit" in dry.stdout


def test_publish_dry_run_refuses_a_card_the_hub_would_reject(sample_store: Path, tmp_path: Path) -> None:
    from ror_annotate.errors import ExportError
    from ror_annotate.export import plan_publish
    from ror_annotate.store import Store

    from ror_annotate.pipeline import export

    with Store(sample_store) as store:
        export(store, tmp_path / "ds")
    readme = tmp_path / "ds" / "README.md"
    good = readme.read_text(encoding="utf-8")
    assert plan_publish(tmp_path / "ds", "org/name").card["license"] == "mit"
    cases = {
        "license: mit": ("license: MIT License", "license 'MIT License'"),
        "size_categories:\n- 1K<n<10K": ("size_categories:\n- tiny", "size_categories ['tiny']"),
        "- data/segments/train-": ("- data/nowhere/train-", "matches none of the files"),
        "---\n": (":\n  - [unclosed\n", "YAML header"),
    }
    for old, (new, message) in cases.items():
        assert old in good, old
        readme.write_text(good.replace(old, new, 1), encoding="utf-8")
        with pytest.raises(ExportError, match=re.escape(message)) as err:
            plan_publish(tmp_path / "ds", "org/name")
        assert err.value.code == "E815"
    readme.write_text(good, encoding="utf-8")
    with pytest.raises(ExportError, match="must look like ORG/NAME"):
        plan_publish(tmp_path / "ds", "no-slash")


def _small_store(tmp_path: Path) -> Path:
    from ror_annotate.pipeline import ingest, segment
    from ror_annotate.store import Store

    src = tmp_path / "t.jsonl"
    src.write_text("".join(json.dumps({"trace_id": f"t{n}", "trace": f"First step {n}. Then check it. So {n}."}) + "\n" for n in range(6)))
    db = tmp_path / "small.duckdb"
    with Store(db) as store:
        ingest(store, src)
        segment(store)
    return db


def test_export_on_a_full_disk_is_one_coded_error_and_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from ror_annotate.errors import ExportError
    from ror_annotate.export import build
    from ror_annotate.pipeline import export
    from ror_annotate.store import Store

    db = _small_store(tmp_path)
    out = tmp_path / "exports" / "ds"

    def full(path: Path, obj: object, **kwargs: object) -> None:
        Path(path).write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(build, "write_json", full)
    with Store(db) as store, pytest.raises(ExportError, match="No space left on device") as err:
        export(store, out)
    assert err.value.code == "E818" and "nothing was left" in err.value.message
    assert list((tmp_path / "exports").iterdir()) == []


def test_export_into_a_folder_that_cannot_be_written_is_one_coded_error(tmp_path: Path) -> None:
    db = _small_store(tmp_path)
    (tmp_path / "afile").write_text("x")
    out = _ror("export", "ds", "--out", str(tmp_path / "afile" / "ds"), "--db", str(db), cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.startswith("error [E817]:") and out.stderr.count("\n") == 1, out.stderr


def test_a_killed_exports_temporary_folder_is_removed_by_the_next_export(tmp_path: Path) -> None:
    import socket

    db = _small_store(tmp_path)
    parent = tmp_path / "exports"
    parent.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    host = socket.gethostname()
    left = {
        "dead": parent / f".ds.tmp-{host}-{dead}-0badc0de",
        "alive": parent / f".ds.tmp-{host}-{os.getpid()}-0badc0df",
        "other-host": parent / f".ds.tmp-elsewhere-{dead}-0badc0e0",
        "other-name": parent / f".other.tmp-{host}-{dead}-0badc0e1",
    }
    for d in left.values():
        d.mkdir()
        (d / "part.parquet").write_bytes(b"x" * 10)
    out = _ror("export", "ds", "--out", str(parent / "ds"), "--db", str(db), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert {k: d.exists() for k, d in left.items()} == {"dead": False, "alive": True, "other-host": True, "other-name": True}
    assert not [p for p in parent.iterdir() if p.name.startswith(".ds.tmp-") and p not in left.values()]


def test_export_of_a_read_only_store_records_its_run_in_the_manifest(tmp_path: Path) -> None:
    from ror_annotate.pipeline import export
    from ror_annotate.store import Store

    db = _small_store(tmp_path)
    with Store(db) as store:
        n_runs = len(store.runs())
    with Store(db, read_only=True) as store:
        export(store, tmp_path / "ds")
    manifest = json.loads((tmp_path / "ds" / "ror_export.json").read_text())
    assert manifest["run"]["command"] == "export" and manifest["run"]["status"] == "ok"
    assert manifest["run"]["recorded_in"] == "manifest (the store was read-only)"
    with Store(db) as store:
        assert len(store.runs()) == n_runs


def test_a_busy_store_names_the_writer_for_read_only_commands(tmp_path: Path) -> None:
    db = _small_store(tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); print('ok', flush=True); time.sleep(120)", str(db)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ok"
        for args in (("agree",), ("export", "ds", "--out", str(tmp_path / "ds")), ("review", "status", "study")):
            out = _ror(*args, "--db", str(db), "--lock-timeout", "0.2", cwd=tmp_path)
            assert out.returncode == 2 and out.stderr.startswith("error [E201]:"), (args, out.stderr)
            assert f"process {holder.pid}" in out.stderr and "duckdb" in out.stderr.lower() and "-c" in out.stderr
            assert "ror status" in out.stderr
    finally:
        holder.kill()
        holder.wait()
