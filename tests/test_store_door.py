"""The store is the only door to the core tables: no SQL on them outside the package ror_annotate/store/.

A stage reads and writes traces, segmentations, segments, labels, annotators, runs and
trace_dependents through Store methods; it owns only its own ``<stage>_*`` tables.
"""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ror_annotate"
STORE = PACKAGE / "store"
CORE = ("traces", "segmentations", "segments", "labels", "annotators", "runs", "trace_dependents", "schema_versions")
SQL_ON_CORE = re.compile(r"\b(FROM|INTO|UPDATE|JOIN|TABLE)\s+(" + "|".join(CORE) + r")\b")


def test_no_core_table_sql_outside_the_store() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if STORE in path.parents:
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if SQL_ON_CORE.search(line):
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{n}: {line.strip()}")
    assert not offenders, "core-table SQL outside ror_annotate/store/ (add a Store method):\n" + "\n".join(offenders)


def test_the_check_finds_such_sql() -> None:
    assert SQL_ON_CORE.search('store.execute("SELECT segment_index FROM labels WHERE trace_id = ?")')
    assert not SQL_ON_CORE.search('store.execute("SELECT * FROM judge_cache")')


def test_the_store_package_is_where_the_check_looks() -> None:
    # the exemption covers the package that holds the SQL, and nothing else
    assert (STORE / "__init__.py").is_file() and not (PACKAGE / "store.py").exists()
    held = [p for p in sorted(STORE.rglob("*.py")) if any(SQL_ON_CORE.search(line) for line in p.read_text(encoding="utf-8").splitlines())]
    assert {p.name for p in held} >= {"traces.py", "segments.py", "labels.py", "runs.py", "annotators.py"}
