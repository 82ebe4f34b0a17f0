"""Shared fixtures: where the real traces are, and small stores built from records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared"
DATA = SHARED / "data"
PITFALLS = SHARED / "pitfalls"


def load_pitfall(case_id: str) -> dict:
    """The pitfall case ``case_id`` from shared/pitfalls (skips when shared/ is absent)."""
    path = PITFALLS / f"{case_id}.json"
    if not path.exists():
        pytest.skip(f"{path} not found (shared/ is not next to the repo)")
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def real_traces_path() -> Path:
    path = DATA / "traces.jsonl"
    if not path.exists():
        pytest.skip(f"{path} not found (shared/ is not next to the repo)")
    return path


@pytest.fixture(scope="session")
def real_trace_rows(real_traces_path: Path) -> list[dict]:
    return [json.loads(line) for line in real_traces_path.open(encoding="utf-8")]


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "store.duckdb"
