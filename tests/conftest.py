"""Shared fixtures: where the real traces are, the pitfall cases, and small stores built from records.

Two tiers of real data:

- the embedded sample (40 MIT-licensed thought-anchors traces inside the package,
  :func:`ror_annotate.sample.sample_path`): every test that needs real traces reads it, so a fresh
  clone runs the whole suite without anything beside it;
- the development data in ``../shared`` (201 traces from three sources, other judges' labels): tests
  marked ``shared`` read it. Without that folder they are deselected (reported in the header and
  the summary, never skipped silently); ``ROR_REQUIRE_SHARED=1`` (CI) makes its absence an error.
  ``ROR_SHARED_DIR`` points elsewhere.

Pitfall cases (small cases from public bug reports) are carried by the tests themselves, in
``tests/pitfalls/*.json``, copied unchanged from ``shared/pitfalls``; a ``shared`` test checks
that the copies still equal the originals.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ror_annotate.sample import sample_path

SHARED = Path(os.environ.get("ROR_SHARED_DIR") or Path(__file__).resolve().parents[2] / "shared")
DATA = SHARED / "data"
SHARED_PITFALLS = SHARED / "pitfalls"
PITFALLS = Path(__file__).resolve().parent / "pitfalls"


def shared_present() -> bool:
    """Whether the development data folder (``../shared`` or ``ROR_SHARED_DIR``) is there."""
    return (DATA / "traces.jsonl").is_file()


def load_pitfall(case_id: str) -> dict:
    """The pitfall case ``case_id`` (input, expected value, sources) from the tests' own copy."""
    return json.loads((PITFALLS / f"{case_id}.json").read_text(encoding="utf-8"))


def pytest_report_header(config: pytest.Config) -> str:
    where = f"found at {SHARED}" if shared_present() else f"absent ({SHARED}): tests marked 'shared' are deselected"
    return f"real traces: the embedded sample ({sample_path().name}); shared data tier {where}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if shared_present():
        return
    tier = [item for item in items if item.get_closest_marker("shared")]
    if not tier:
        return
    if os.environ.get("ROR_REQUIRE_SHARED"):
        raise pytest.UsageError(f"ROR_REQUIRE_SHARED is set but {DATA / 'traces.jsonl'} is missing ({len(tier)} tests need it)")
    items[:] = [item for item in items if not item.get_closest_marker("shared")]
    config.hook.pytest_deselected(items=tier)


@pytest.fixture(scope="session")
def real_traces_path() -> Path:
    """The embedded sample: 40 real reasoning traces (JSONL), always present."""
    return sample_path()


@pytest.fixture(scope="session")
def real_trace_rows(real_traces_path: Path) -> list[dict]:
    return [json.loads(line) for line in real_traces_path.open(encoding="utf-8")]


@pytest.fixture(scope="session")
def shared_traces_path() -> Path:
    """``shared/data/traces.jsonl`` (201 traces); only for tests marked ``shared``."""
    return DATA / "traces.jsonl"


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "store.duckdb"


@pytest.fixture
def no_openai_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``OPENAI_API_KEY`` or ``OPENAI_BASE_URL`` of the machine reaches the test (the judge tests
    talk to local fake servers only; a real key must never be sent, or shown in a failure)."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
