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
