"""Issue 27, small items: `ror agree ... | head -1` exits 0, an unterminated quote in a CSV is a
coded error, a hub failure leaves no empty store file.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from ror_annotate.errors import InputError


def _labels_csv(path: Path, n: int = 400) -> Path:
    behaviors = ["planning", "execution", "reflection", "fact", "conclusion", "restatement"]
    rows = ["item_id,annotator,label"]
    for i in range(n):
        rows += [f"i{i},a,{behaviors[i % 6]}", f"i{i},b,{behaviors[(i * 7) % 6]}"]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("reader", ["head -1", "true"])
@pytest.mark.parametrize("fmt", ["", "--json"])
def test_agree_into_a_closed_pipe_exits_0(tmp_path: Path, reader: str, fmt: str) -> None:
    # `true` closes the pipe before anything is written: every write meets a broken pipe
    csv_path = _labels_csv(tmp_path / "l.csv")
    cmd = f"{shlex.quote(sys.executable)} -m ror_annotate agree --from-csv {shlex.quote(str(csv_path))} {fmt} | {reader} >/dev/null; echo \" rc=${{PIPESTATUS[0]}}\""
    out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.stdout.endswith(" rc=0\n"), (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr


def test_unterminated_quote_in_a_csv_is_a_coded_error(tmp_path: Path) -> None:
    from ror_annotate.agreement import ratings_from_csv

    path = tmp_path / "q.csv"
    path.write_text('item_id,annotator,label\ni1,a,"planning\ni1,b,fact\ni2,a,fact\n', encoding="utf-8")
    with pytest.raises(InputError, match=r"q\.csv: line \d+: malformed CSV") as err:
        ratings_from_csv(path)
    assert err.value.code == "E940"
    out = subprocess.run([sys.executable, "-m", "ror_annotate", "agree", "--from-csv", str(path)], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.returncode == 2 and out.stderr.startswith("error [E940]:")


@pytest.mark.parametrize("command", ["ingest", "run"])
def test_a_hub_failure_leaves_no_empty_store_file(tmp_path: Path, command: str) -> None:
    db = tmp_path / "new.duckdb"
    out = subprocess.run([sys.executable, "-m", "ror_annotate", command, "some-org/some-dataset", "--db", str(db)],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": os.getcwd(), "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 2 and "error [E100]" in out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_failing_command_keeps_an_existing_store(tmp_path: Path) -> None:
    from ror_annotate.store import Store

    db = tmp_path / "old.duckdb"
    Store(db).close()
    out = subprocess.run([sys.executable, "-m", "ror_annotate", "ingest", "some-org/some-dataset", "--db", str(db)],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": os.getcwd(), "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 2 and db.is_file()
