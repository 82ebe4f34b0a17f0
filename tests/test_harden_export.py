"""Issue 27, export and publishing: a source's licence is kept with the stored traces; `ror publish
--dry-run`; export faults (disk full, read-only folder, a killed export's temporary folder, a
read-only store).

Expected values are written by hand from the inputs next to them.
"""

from __future__ import annotations

import json
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
