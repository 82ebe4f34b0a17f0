"""scripts/split_store.py: the codemod that turns ror_annotate/store.py into the package ror_annotate/store/.

It runs on a small store.py written here (stdlib only, so the generated package imports in a
subprocess without the rest of ror_annotate), shaped like the real one: constants with ``#:``
comments, a relative import used inside a method, a method returning ``"Store"``, a method and a
top-level function the mapping does not know (what a merged branch adds).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "split_store.py"

STORE_PY = '''"""A tiny store."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .errors import StoreError

#: Schema of the core tables.
CORE_MIGRATIONS: tuple[str, ...] = ("CREATE TABLE traces (trace_id VARCHAR)",)
_IDS_FILTER = "trace_id IN (SELECT unnest(?::VARCHAR[]))"


def to_naive_utc(value: Any) -> Any:
    """Naive UTC."""
    return value


def brand_new_helper() -> str:
    return "new"


class Store:
    """The store."""

    def __init__(self, path: str = ":memory:") -> None:
        self.path = path
        self._closed = False
        self.rows: list[str] = []

    # ------------------------------------------------------------------ lifecycle
    @contextmanager
    def transaction(self) -> Iterator["Store"]:
        """Join the transaction."""
        yield self

    def _count(self, sql: str) -> int:
        return len(self.rows)

    # ------------------------------------------------------------------ traces
    def upsert_traces(self, traces: list[str]) -> int:
        """Store traces."""
        from .errors import StoreError as Again  # a relative import inside a method

        if not all(traces):
            raise Again("empty id")
        with self.transaction():
            self.rows += traces
        return len(traces)

    def trace_ids(self) -> list[str]:
        return json.loads(json.dumps(self.rows))

    def merged_method(self) -> str:
        """Appended by another branch."""
        return brand_new_helper() + _IDS_FILTER

    def counts(self) -> dict[str, int]:
        return {"traces": self._count("SELECT count(*) FROM traces")}
'''

ERRORS_PY = "class StoreError(RuntimeError):\n    pass\n"


def _tree(root: Path) -> None:
    pkg = root / "ror_annotate"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("", encoding="utf-8")
    (pkg / "errors.py").write_text(ERRORS_PY, encoding="utf-8")
    (pkg / "store.py").write_text(STORE_PY, encoding="utf-8")


def _split(root: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), "--root", str(root), *extra], capture_output=True, text=True, timeout=60)


def _package(root: Path) -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in sorted((root / "ror_annotate" / "store").glob("*.py"))}


@pytest.fixture()
def split(tmp_path: Path) -> tuple[Path, subprocess.CompletedProcess[str]]:
    _tree(tmp_path)
    return tmp_path, _split(tmp_path)


def test_the_package_works_like_the_module(split: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    root, out = split
    assert out.returncode == 0, out.stderr
    assert not (root / "ror_annotate" / "store.py").exists()
    code = (
        "from ror_annotate.store import Store, CORE_MIGRATIONS, to_naive_utc, StoreError\n"
        "s = Store()\n"
        "assert s.upsert_traces(['a', 'b']) == 2 and s.trace_ids() == ['a', 'b']\n"
        "assert s.counts() == {'traces': 2} and s.merged_method().startswith('newtrace_id IN')\n"
        "assert CORE_MIGRATIONS[0].startswith('CREATE TABLE traces') and to_naive_utc(3) == 3\n"
        "try:\n    s.upsert_traces([''])\nexcept StoreError as e:\n    print('refused', e)\n"
        "with s.transaction() as t:\n    assert t is s\n"
        "print(sorted(c.__name__ for c in Store.__mro__))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(root)}, cwd=root)
    assert run.returncode == 0, run.stderr
    assert "refused empty id" in run.stdout
    assert "'ConnectionMixin'" in run.stdout and "'TracesMixin'" in run.stdout and "'OtherMixin'" in run.stdout


def test_layout_comments_and_the_unknown_names(split: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    root, out = split
    files = _package(root)
    assert set(files) == {"__init__.py", "access.py", "connection.py", "core.py", "other.py", "schema.py", "traces.py"}
    # comments and docstrings travel with their code
    assert "#: Schema of the core tables.\nCORE_MIGRATIONS" in files["schema.py"]
    assert "    # ------------------------------------------------------------------ traces\n    def upsert_traces" in files["traces.py"]
    assert '"""Store traces."""' in files["traces.py"] and '"""The store."""' in files["core.py"]
    # the nested relative import gains a dot; the self-typed method keeps an exact type
    assert "        from ..errors import StoreError as Again" in files["traces.py"]
    assert "def transaction(self: _S) -> Iterator[_S]:" in files["connection.py"]
    assert '_S = TypeVar("_S", bound="ConnectionMixin")' in files["connection.py"]
    # what the mapping does not know lands in a valid default place, and is printed
    assert "def merged_method(self)" in files["other.py"] and "class OtherMixin(AccessMixin)" in files["other.py"]
    assert "def brand_new_helper()" in files["other.py"]
    assert "NOT IN THE MAPPING: method Store.merged_method -> OtherMixin" in out.stdout
    assert "NOT IN THE MAPPING: top-level brand_new_helper -> other" in out.stdout
    # each module imports what it uses: names defined elsewhere in the package come from their module
    other = ast.parse(files["other.py"])
    imported = {a.name for n in other.body if isinstance(n, ast.ImportFrom) for a in n.names}
    assert {"_IDS_FILTER", "AccessMixin"} <= imported and "json" not in imported and "brand_new_helper" not in imported
    assert "class Store(TracesMixin, OtherMixin):" in files["core.py"]
    assert '"Store"' not in files["connection.py"]


def test_deterministic_and_refuses_a_second_split(split: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    root, _ = split
    first = _package(root)
    again = _split(root)
    assert again.returncode == 0 and "nothing to do" in again.stdout and _package(root) == first
    # a merge brings store.py back next to the package: refused unless asked to regenerate
    (root / "ror_annotate" / "store.py").write_text(STORE_PY, encoding="utf-8")
    refused = _split(root)
    assert refused.returncode == 1 and "--replace" in refused.stderr
    (root / "ror_annotate" / "store" / "stale.py").write_text("x = 1\n", encoding="utf-8")
    regenerated = _split(root, "--replace")
    assert regenerated.returncode == 0, regenerated.stderr
    assert _package(root) == first  # same input, same bytes; a module it no longer writes is gone


def test_a_store_class_it_cannot_split_is_refused(tmp_path: Path) -> None:
    _tree(tmp_path)
    path = tmp_path / "ror_annotate" / "store.py"
    path.write_text(STORE_PY.replace("class Store:", "class Store(Base):"), encoding="utf-8")
    out = _split(tmp_path)
    assert out.returncode == 1 and "plain class" in out.stderr
    assert path.exists() and not (tmp_path / "ror_annotate" / "store").exists()
