"""Export layout version 2: row groups follow the rows, not the batches (same rows -> same bytes)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ror_annotate.export import export_dataset
from ror_annotate.export.write import LAYOUT_VERSION, row_weights, table_row_weights

from . import tokenizers_fixtures as F
from .test_export import make_store, tree_digest

_VOLATILE = {"README.md", "ror_export.json", "state.json"}


def _data_files(root):
    return {k: v for k, v in tree_digest(root).items() if k.rsplit("/", 1)[-1] not in _VOLATILE}


def test_row_weights_by_hand():
    """Each rule on values whose bytes are counted by hand (UTF-8 bytes + 4-byte offsets, item widths)."""
    strings = pa.array(["ab", "é", None, ""])  # 2, 2 (é is 2 UTF-8 bytes), null, 0 bytes
    assert row_weights(strings).tolist() == [6, 6, 4, 4]
    assert row_weights(pa.array([1, None, 3], pa.int64())).tolist() == [8, 8, 8]
    assert row_weights(pa.array([1.0], pa.float32())).tolist() == [4]
    assert row_weights(pa.array([True, False])).tolist() == [1, 1]
    lists = pa.array([[1, 2, 3], [], None, [4]], pa.list_(pa.int64()))
    assert row_weights(lists).tolist() == [3 * 8 + 4, 4, 4, 8 + 4]
    nested = pa.array([[["a", "bcd"]], [[]]], pa.list_(pa.list_(pa.string())))
    assert row_weights(nested).tolist() == [4 + (4 + (1 + 4) + (3 + 4)), 4 + 4]
    pairs = pa.array([[1, 2], [3, 4]], pa.list_(pa.int32(), 2))
    assert row_weights(pairs).tolist() == [8, 8]
    structs = pa.array([{"a": "xy", "b": 1}, {"a": None, "b": 2}], pa.struct([("a", pa.string()), ("b", pa.int64())]))
    assert row_weights(structs).tolist() == [2 + 4 + 8, 4 + 8]
    raters = pa.array([[{"annotator": "j1", "label": 3}], []], pa.list_(pa.struct([("annotator", pa.string()), ("label", pa.int64())])))
    assert row_weights(raters).tolist() == [4 + (2 + 4 + 8), 4]


def test_row_weights_ignore_slicing_and_chunking():
    rng = np.random.default_rng(0)
    values = [None if rng.random() < 0.1 else [int(x) for x in rng.integers(0, 9, rng.integers(0, 5))] for _ in range(50)]
    words = [None if rng.random() < 0.1 else "w" * int(rng.integers(0, 7)) for _ in range(50)]
    table = pa.table({"l": pa.array(values, pa.list_(pa.int64())), "s": pa.array(words),
                      "st": pa.array([{"x": w, "y": v} for w, v in zip(words, values)])})
    whole = table_row_weights(table)
    for lo, hi in ((0, 7), (7, 31), (31, 50), (13, 14)):
        assert table_row_weights(table.slice(lo, hi - lo)).tolist() == whole[lo:hi].tolist()
    chunked = pa.concat_tables([table.slice(0, 20), table.slice(20)])
    assert table_row_weights(chunked).tolist() == whole.tolist()
    fresh = pa.table({"l": pa.array(values[20:], pa.list_(pa.int64())), "s": pa.array(words[20:]),
                      "st": pa.array([{"x": w, "y": v} for w, v in zip(words[20:], values[20:])])})
    assert table_row_weights(fresh).tolist() == whole[20:].tolist()


def test_same_rows_same_bytes_whatever_the_batches(tmp_path, monkeypatch):
    """One trace per batch and everything in one batch write byte-identical data files, with groups of a
    few rows (so row groups really are cut inside batches and across them); the manifest says version 2."""
    import ror_annotate.export.write as write

    store = make_store(tmp_path / "s.duckdb")
    tok = F.byte_level_bpe()
    monkeypatch.setattr(write, "ROW_GROUP_BYTES", 300)  # a few segment rows per group
    export_dataset(store, tmp_path / "big", tokenizer=tok, split_fractions=(1, 0, 0))
    export_dataset(store, tmp_path / "small", tokenizer=tok, split_fractions=(1, 0, 0), batch_size=1, max_batch_segments=1)
    export_dataset(store, tmp_path / "two", tokenizer=tok, split_fractions=(1, 0, 0), batch_size=2)
    big = _data_files(tmp_path / "big")
    assert any(k.endswith(".parquet") for k in big) and any(k.endswith(".arrow") for k in big)
    assert big == _data_files(tmp_path / "small") == _data_files(tmp_path / "two")
    seg = pq.ParquetFile(tmp_path / "big" / "data" / "segments" / "train-00000-of-00001.parquet")
    groups = [seg.metadata.row_group(i).num_rows for i in range(seg.metadata.num_row_groups)]
    assert len(groups) > 1 and sum(groups) == seg.metadata.num_rows
    # every group but the last closes at the first row that takes it to ROW_GROUP_BYTES
    w = table_row_weights(seg.read().cast(seg.schema_arrow))
    start = 0
    for n in groups[:-1]:
        assert w[start:start + n].sum() >= 300 > w[start:start + n - 1].sum()
        start += n
    manifest = json.loads((tmp_path / "big" / "ror_export.json").read_text())
    assert manifest["layout_version"] == LAYOUT_VERSION == 2
