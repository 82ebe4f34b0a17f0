"""Write, swap in and publish an export.

Rows arrive in batches and go straight to disk: for every configuration and split one parquet
writer (``data/<config>/<split>-0000i-of-0000n.parquet``, the hub layout) and one Arrow writer in
the ``save_to_disk`` layout (``<config>/<split>/data-0000i-of-0000n.arrow``, ``state.json``,
``dataset_info.json``), both ``datasets``' own writers, so memory stays bounded whatever the corpus
size. Shards roll over at :data:`MAX_SHARD_BYTES`; the rows of one split are gathered into row groups
of about :data:`ROW_GROUP_BYTES`, because a parquet writer holds the metadata (statistics, page index) of
every row group of the open file until it closes, so one small row group per batch made the writer grow
with the corpus.

Layout version 2 (:data:`LAYOUT_VERSION`): a row group ends after the first row at which the group's
*row weight* (:func:`row_weights`: bytes of the row's values, a function of the row alone) reaches
:data:`ROW_GROUP_BYTES`, and each group is written as one contiguous Arrow chunk. The files therefore
depend on the rows only, not on how the reader batched them (version 1 closed a group at the end of
the first batch of 64 traces that took it over the size, so the bytes changed with the batch size).

Everything is written into a sibling temporary directory and swapped in by rename, so a failed
export never leaves a half-written dataset; a directory that is not a ror_annotate export (no
``ror_export.json``) and not empty is never replaced.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import ExportError, ExportWriteError
from .features import features_of
from .splits import SPLITS

if TYPE_CHECKING:  # pragma: no cover
    import datasets

MANIFEST = "ror_export.json"
#: Parquet / Arrow shard size target (bytes of Arrow data); one file per split below it.
MAX_SHARD_BYTES = 500 * 2**20
#: Row group size target (bytes of Arrow data, held per split until written). ``datasets`` writes one
#: row group per write call (at most 1,000 rows), ~870 groups for 800k segments, and the writer keeps
#: every group's footer metadata until it closes: the export alone grew by 94 MiB from 250k to 1M
#: segments, 61 MiB with 1 MiB groups (larger groups cost more buffered rows than they save).
#: Far under the 100 MB that ``datasets`` and the hub's viewer take as the largest convenient group.
ROW_GROUP_BYTES = 2**20
#: Row cap of one row group (pyarrow's own default).
ROW_GROUP_MAX_ROWS = 2**20
#: Version of the byte layout of the data files (how rows fall into row groups and Arrow record
#: batches); recorded in the manifest as ``layout_version``. 1: groups closed at the batch (64 traces)
#: that took them over :data:`ROW_GROUP_BYTES` of Arrow ``nbytes``; 2: groups closed at the row that takes
#: their :func:`row_weights` to :data:`ROW_GROUP_BYTES`, whatever the batching (same rows, same bytes).
LAYOUT_VERSION = 2
#: Files of an export that go to the hub; the save_to_disk copies stay local (the parquet files are the same rows).
PUBLISH_PATTERNS = ["README.md", "analytics.json", "data/**", "agreement/**"]
#: Licence identifiers that do not by themselves allow redistributing a source's text.
UNPUBLISHABLE_LICENSES = frozenset({"", "unknown", "none", "other", "noassertion", "all-rights-reserved", "proprietary"})
#: Code of the refusal to publish text whose licence is unknown.
UNKNOWN_LICENSE = "E812"


def license_allows_publishing(license: str | None) -> bool:
    """Whether a source's licence identifier, as given, permits publishing its text (unknown: no)."""
    return license is not None and license.strip().lower() not in UNPUBLISHABLE_LICENSES


def _list_weights(offsets: np.ndarray, child: np.ndarray, valid: np.ndarray | None, offset_width: int) -> np.ndarray:
    cum = np.concatenate(([0], np.cumsum(child, dtype=np.int64)))
    w = cum[offsets[1:]] - cum[offsets[:-1]] + offset_width
    return w if valid is None else np.where(valid, w, offset_width)


def _valid(array: pa.Array) -> np.ndarray | None:
    if array.null_count == 0:
        return None
    return np.asarray(array.is_valid().to_numpy(zero_copy_only=False), dtype=bool)


def row_weights(array: "pa.Array | pa.ChunkedArray") -> np.ndarray:
    """Bytes each row of a column counts for when rows are gathered into row groups.

    A function of each value alone (never of how the rows are chunked or sliced): fixed-width
    values count their width (booleans 1), strings and binaries their bytes plus a 4-byte offset
    (8 for the large types), lists the weights of their items plus an offset, fixed-size lists their
    items, structs the sum of their fields, dictionary-encoded values their index width. A null counts
    as its type's fixed part (its items, if any, are not counted).

    Parameters
    ----------
    array : pyarrow.Array or pyarrow.ChunkedArray
        ``[n_rows]`` one column.

    Returns
    -------
    numpy.ndarray
        ``[n_rows]`` int64 weights (bytes).

    Raises
    ------
    TypeError
        A type without a rule here (unions, maps, extension types): the export's features have none.
    """
    if isinstance(array, pa.ChunkedArray):
        parts = [row_weights(c) for c in array.chunks]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    t = array.type
    n = len(array)
    if pa.types.is_null(t):
        return np.zeros(n, dtype=np.int64)
    if pa.types.is_boolean(t):
        return np.ones(n, dtype=np.int64)
    if pa.types.is_dictionary(t):
        return np.full(n, t.index_type.bit_width // 8, dtype=np.int64)
    if pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        width = 8 if (pa.types.is_large_string(t) or pa.types.is_large_binary(t)) else 4
        lengths = np.asarray(pc.binary_length(array).fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
        return lengths + width
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        offsets = np.asarray(array.offsets, dtype=np.int64)  # of the slice: len(array) + 1 values into array.values
        width = 8 if pa.types.is_large_list(t) else 4
        return _list_weights(offsets, row_weights(array.values), _valid(array), width)
    if pa.types.is_fixed_size_list(t):
        size = t.list_size
        child = row_weights(array.values)[array.offset * size:(array.offset + n) * size]
        w = child.reshape(n, size).sum(axis=1) if size else np.zeros(n, dtype=np.int64)
        valid = _valid(array)
        return w if valid is None else np.where(valid, w, 0)
    if pa.types.is_struct(t):
        w = np.zeros(n, dtype=np.int64)
        for child in array.flatten():  # the fields of this slice
            w += row_weights(child)
        return w
    if getattr(t, "bit_width", 0) and t.bit_width % 8 == 0:  # integers, floats, dates, timestamps, decimals
        return np.full(n, t.bit_width // 8, dtype=np.int64)
    raise TypeError(f"no row weight for Arrow type {t}")


def table_row_weights(table: pa.Table) -> np.ndarray:
    """:func:`row_weights` summed over the columns of ``table``: ``[n_rows]`` int64 bytes."""
    w = np.zeros(table.num_rows, dtype=np.int64)
    for column in table.columns:
        w += row_weights(column)
    return w


class _ShardedWriter:
    """One (config, split): a parquet writer and an Arrow (save_to_disk) writer fed the same batches."""

    def __init__(self, root: Path, config: str, split: str, features: "datasets.Features") -> None:
        self.root, self.config, self.split, self.features = root, config, split, features
        self.schema = features.arrow_schema
        self.n_rows = 0
        self.n_bytes = 0  # the rows' weights (row_weights), the split's num_bytes in dataset_info.json
        self._shards: list[tuple[Path, Path]] = []
        self._shard_bytes = 0
        self._pq: Any = None
        self._arrow: Any = None
        self._pending: list[pa.Table] = []
        self._pending_bytes = 0

    def _open(self) -> None:
        from datasets.arrow_writer import ArrowWriter, ParquetWriter

        i = len(self._shards)
        pq_path = self.root / "data" / self.config / f".{self.split}-{i:05d}.parquet.part"
        ar_path = self.root / self.config / self.split / f".data-{i:05d}.arrow.part"
        pq_path.parent.mkdir(parents=True, exist_ok=True)
        ar_path.parent.mkdir(parents=True, exist_ok=True)
        # writer_batch_size is the parquet row-group cap; the rows of one write call form one group
        self._pq = ParquetWriter(features=self.features, path=str(pq_path), writer_batch_size=ROW_GROUP_MAX_ROWS)
        self._arrow = ArrowWriter(features=self.features, path=str(ar_path))
        self._shards.append((pq_path, ar_path))
        self._shard_bytes = 0

    def _close_shard(self) -> None:
        self._flush()
        self._finish_shard()

    def _finish_shard(self) -> None:
        if self._pq is not None:
            self._pq.finalize()
            self._pq.close()
            self._arrow.finalize()
            self._arrow.close()
            self._pq = self._arrow = None

    def write(self, table: pa.Table) -> None:
        """Gather ``table``'s rows; every row that takes the pending rows' weight to :data:`ROW_GROUP_BYTES`
        closes a row group (layout version 2: the groups depend on the rows, not on the batches)."""
        table = table.cast(self.schema)
        self.n_rows += table.num_rows
        cum = np.cumsum(table_row_weights(table))
        start, done = 0, 0  # done: weight of the rows before ``start``
        while start < table.num_rows:
            # the first row whose cumulative weight, with the pending rows', reaches the group size
            end = int(np.searchsorted(cum, ROW_GROUP_BYTES - self._pending_bytes + done, side="left"))
            if end >= table.num_rows:
                self._pending.append(table.slice(start))
                self._pending_bytes += int(cum[-1]) - done
                return
            self._pending.append(table.slice(start, end + 1 - start))
            self._pending_bytes += int(cum[end]) - done
            self._flush()
            start, done = end + 1, int(cum[end])

    def _flush(self) -> None:
        """Write the gathered rows as one row group (into a new shard if the open one is full)."""
        if not self._pending:
            return
        if self._pq is None or self._shard_bytes >= MAX_SHARD_BYTES:
            self._finish_shard()
            self._open()
        # one contiguous copy per column (concat_arrays copies even one slice, so a slice's unused parent bytes
        # never reach the Arrow file): how the batches were cut must not show in the pages or record batches
        gathered = pa.concat_tables(self._pending)
        table = pa.Table.from_arrays([pa.concat_arrays(c.chunks) for c in gathered.columns], schema=gathered.schema)
        # the rows' weight, not nbytes: nbytes counts validity bitmaps that exist or not depending on the batch
        n_bytes = self._pending_bytes
        self._pending, self._pending_bytes = [], 0
        self._shard_bytes += n_bytes
        self.n_bytes += n_bytes
        self._pq.write_table(table)
        self._arrow.write_table(table)

    def close(self, fingerprint_seed: str) -> list[str]:
        """Finish the shards, name them ``-i-of-n``, write the save_to_disk metadata; return parquet paths (relative)."""
        self._close_shard()
        n = len(self._shards)
        rel_parquet = []
        for i, (pq_path, ar_path) in enumerate(self._shards):
            final_pq = pq_path.parent / f"{self.split}-{i:05d}-of-{n:05d}.parquet"
            os.replace(pq_path, final_pq)
            os.replace(ar_path, ar_path.parent / f"data-{i:05d}-of-{n:05d}.arrow")
            rel_parquet.append(final_pq.relative_to(self.root).as_posix())
        from datasets import DatasetInfo, SplitDict, SplitInfo
        from datasets.utils.py_utils import asdict

        split_dict = SplitDict()
        split_dict.add(SplitInfo(name=self.split, num_bytes=self.n_bytes, num_examples=self.n_rows))
        info = DatasetInfo(features=self.features.copy(), config_name=self.config, splits=split_dict, dataset_size=self.n_bytes)
        state: dict[str, Any] = {
            "_data_files": [{"filename": f"data-{i:05d}-of-{n:05d}.arrow"} for i in range(n)],
            "_fingerprint": hashlib.sha256(f"{fingerprint_seed}/{self.config}/{self.split}/{self.n_rows}/{self.n_bytes}".encode()).hexdigest()[:16],
            "_format_columns": None,
            "_format_kwargs": {},
            "_format_type": None,
            "_output_all_columns": False,
            "_split": self.split,
        }
        split_dir = self.root / self.config / self.split
        (split_dir / "state.json").write_text(json.dumps(state, indent=2, sort_keys=True), encoding="utf-8")
        info_dict = asdict(info)
        (split_dir / "dataset_info.json").write_text(json.dumps({k: info_dict[k] for k in sorted(info_dict)}, indent=2), encoding="utf-8")
        return rel_parquet

    def abort(self) -> None:
        self._pending, self._pending_bytes = [], 0
        try:
            self._finish_shard()
        except Exception:  # noqa: BLE001 - best effort while the export is already failing; the tmp dir is removed
            pass


class ExportWriter:
    """Streams row batches of every configuration into one temporary export directory.

    Parameters
    ----------
    tmp : Path
        The (new, empty) temporary directory.
    configs : sequence of str
        Configurations written (``traces``, ``segments``, ``tokens``).
    """

    def __init__(self, tmp: Path, configs: Sequence[str]) -> None:
        self.tmp = tmp
        self.configs = list(configs)
        self._features = {c: features_of(c) for c in self.configs}
        self._writers: dict[tuple[str, str], _ShardedWriter] = {}

    def write(self, config: str, split: str, table: pa.Table) -> None:
        """Append a batch of rows (columns named as the config's features) to one split."""
        if table.num_rows == 0:
            return
        key = (config, split)
        if key not in self._writers:
            self._writers[key] = _ShardedWriter(self.tmp, config, split, self._features[config])
        self._writers[key].write(table)

    def close(self, fingerprint_seed: str) -> tuple[dict[str, dict[str, list[str]]], dict[str, Any], dict[str, dict[str, int]]]:
        """Finish every file.

        Returns
        -------
        (data_files, infos, n_rows)
            ``{config: {split: [relative parquet glob]}}``, ``{config: (Features, {split: (n_rows, n_bytes)})}``
            and ``{config: {split: n_rows}}``; splits without rows are absent.
        """
        data_files: dict[str, dict[str, list[str]]] = {}
        infos: dict[str, Any] = {}
        n_rows: dict[str, dict[str, int]] = {}
        for config in self.configs:
            splits = [s for s in SPLITS if (config, s) in self._writers]
            if not splits:
                continue
            data_files[config] = {}
            sizes = {}
            for split in splits:
                w = self._writers[(config, split)]
                w.close(fingerprint_seed)
                data_files[config][split] = [f"data/{config}/{split}-*.parquet"]
                sizes[split] = (w.n_rows, w.n_bytes)
            (self.tmp / config / "dataset_dict.json").write_text(json.dumps({"splits": splits}), encoding="utf-8")
            infos[config] = (self._features[config], sizes)
            n_rows[config] = {s: sizes[s][0] for s in splits}
        return data_files, infos, n_rows

    def abort(self) -> None:
        for w in self._writers.values():
            w.abort()


def is_export_dir(path: Path) -> bool:
    """Whether ``path`` holds a ror_annotate export (its manifest)."""
    return (path / MANIFEST).is_file()


def check_replaceable(out_dir: Path) -> None:
    """Refuse to replace a non-empty directory that is not an export (raises :class:`ExportError`)."""
    if out_dir.exists() and (not out_dir.is_dir() or (any(out_dir.iterdir()) and not is_export_dir(out_dir))):
        raise ExportError(
            f"{out_dir} exists and is not a ror_annotate export (no {MANIFEST}); refusing to replace it. "
            "Choose another --out, or remove that directory yourself"
        )


#: Code of an export directory that cannot be created or written (read-only folder, a file in the way).
CANNOT_WRITE = "E817"
#: Code of an export that failed while writing (disk full, I/O error); nothing is left behind.
WRITE_FAILED = "E818"


def _tmp_prefix(out_dir: Path, kind: str = "tmp") -> str:
    return f".{out_dir.name}.{kind}-"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: another user's live process
        return True
    return True


def remove_stale_tmp_dirs(out_dir: Path) -> list[Path]:
    """Remove the hidden build folders (``.NAME.tmp-HOST-PID-*``, ``.NAME.old-HOST-PID-*``) that a killed
    export of ``out_dir`` left beside it: only those of this host whose process is gone.

    Returns
    -------
    list of Path
        The folders removed.
    """
    import socket

    host = socket.gethostname()
    removed = []
    try:
        siblings = list(out_dir.parent.iterdir())
    except OSError:
        return []
    for path in siblings:
        for kind in ("tmp", "old"):
            prefix = _tmp_prefix(out_dir, kind) + host + "-"
            if not path.name.startswith(prefix) or not path.is_dir():
                continue
            pid_text = path.name[len(prefix):].split("-", 1)[0]
            if pid_text.isdigit() and int(pid_text) != os.getpid() and not _pid_alive(int(pid_text)):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed


def _tag() -> str:
    import socket

    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def new_tmp_dir(out_dir: Path) -> Path:
    """A fresh sibling directory of ``out_dir`` to build the export in (same filesystem: rename works).

    Its name, ``.NAME.tmp-HOST-PID-RANDOM``, lets a later export remove it if this process is killed
    (:func:`remove_stale_tmp_dirs`, called here first).

    Raises
    ------
    ExportError
        ``E817``: the parent folder cannot be created or written (read-only, a file in the way).
    """
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_tmp_dirs(out_dir)
        tmp = out_dir.parent / f"{_tmp_prefix(out_dir)}{_tag()}"
        tmp.mkdir()
    except OSError as exc:
        raise ExportWriteError(
            f"cannot write the export {out_dir}: {exc.strerror or exc} ({exc.filename or out_dir.parent}); "
            "choose a writable --out folder",
            code=CANNOT_WRITE,
        ) from None
    return tmp


def swap_in(tmp: Path, out_dir: Path) -> None:
    """Replace ``out_dir`` by ``tmp`` with renames on one filesystem; the old export survives any failure."""
    if not out_dir.exists():
        os.rename(tmp, out_dir)
        return
    check_replaceable(out_dir)
    old = out_dir.parent / f"{_tmp_prefix(out_dir, 'old')}{_tag()}"
    os.rename(out_dir, old)
    try:
        os.rename(tmp, out_dir)
    except BaseException:
        os.rename(old, out_dir)
        raise
    shutil.rmtree(old, ignore_errors=True)


def write_json(path: Path, obj: Any, *, indent: int | None = 2) -> None:
    """Write ``obj`` as UTF-8 JSON."""
    path.write_text(json.dumps(obj, indent=indent, default=str, ensure_ascii=False), encoding="utf-8")


def load_export(out_dir: Path | str, config: str = "segments") -> "datasets.DatasetDict":
    """Load one configuration of an export with ``datasets.load_from_disk``.

    Raises
    ------
    ExportError
        ``out_dir`` is not an export or lacks ``config``.
    """
    from datasets import load_from_disk

    out_dir = Path(out_dir)
    if not (out_dir / config).is_dir():
        hint = "export with --tokenizer to get 'tokens'" if config == "tokens" else "re-export with this version"
        raise ExportError(f"{out_dir} has no {config!r} configuration; {hint}")
    return load_from_disk(str(out_dir / config))


def resolve_export_dir(name_or_path: str | Path, exports_dir: Path | str = "exports") -> Path:
    """``exports/<name>`` for a bare name, else the path itself; it must hold an export.

    Raises
    ------
    ExportError
        No ror_annotate export there.
    """
    p = Path(name_or_path)
    candidates = [p] if (p.is_absolute() or len(p.parts) > 1) else [Path(exports_dir) / p, p]
    for c in candidates:
        if is_export_dir(c):
            return c.resolve()
    raise ExportError(
        f"no export named {str(name_or_path)!r}: looked for {MANIFEST} in {', '.join(str(c) for c in candidates)}; "
        "run ror export (or ror run) first"
    )


def unpublishable_sources(out_dir: Path) -> list[dict[str, Any]]:
    """Sources of an export whose licence does not (knowingly) allow publishing their text.

    Reads the manifest's ``sources`` list; an export without one (written before licences were
    recorded) counts as one unknown source.
    """
    manifest = json.loads((out_dir / MANIFEST).read_text(encoding="utf-8"))
    sources = manifest.get("sources")
    if sources is None:
        return [{"source": "(all: this export records no licences)", "license": None, "n_traces": manifest.get("n_traces")}]
    return [s for s in sources if not license_allows_publishing(s.get("license"))]


def _check_publishable(out_dir: Path, repo_id: str, allow_unknown_license: bool) -> None:
    """The refusals of :func:`publish_export` that need no network: repo id shape, licences."""
    if not repo_id or repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise ExportError(f"--repo-id {repo_id!r} must look like ORG/NAME")
    blocked = unpublishable_sources(out_dir)
    if blocked and not allow_unknown_license:
        listed = ", ".join(f"{b.get('source')} ({b.get('license') or 'unknown'}, {b.get('n_traces')} traces)" for b in blocked)
        raise ExportError(
            f"{out_dir} holds reasoning text of sources whose licence does not allow publishing it: {listed}. Re-export "
            "with --source-license SOURCE=LICENSE for sources you have checked, leave those traces out, or pass "
            "--allow-unknown-license if you have the right to publish them",
            code=UNKNOWN_LICENSE,
        )


def publish_export(
    name_or_path: str | Path,
    repo_id: str,
    *,
    exports_dir: Path | str = "exports",
    private: bool = False,
    endpoint: str | None = None,
    token: str | None = None,
    allow_unknown_license: bool = False,
) -> str:
    """Push an export (card, parquet files, analytics) to a dataset repository on the Hugging Face hub.

    Parameters
    ----------
    name_or_path : str or Path
        Export name under ``exports_dir``, or its directory.
    repo_id : str
        ``"ORG/NAME"``; created (as a dataset repository) if missing.
    private : bool
        Create the repository as private.
    endpoint : str, optional
        Hub URL (default: ``huggingface_hub``'s, which honours ``HF_ENDPOINT``).
    token : str, optional
        Defaults to the ``HF_TOKEN`` environment variable. The token is passed to the client only:
        it is never written to the store, the export, logs or error messages.
    allow_unknown_license : bool, default False
        Publish even though some source's licence is unknown or does not allow redistribution.
        The export ships the traces' text (``traces``, ``segments`` and ``tokens``), so by default
        such an export is refused.

    Returns
    -------
    str
        URL of the commit.

    Raises
    ------
    ExportError
        No export; text of a source with an unknown licence (code ``E812``, unless
        ``allow_unknown_license``); no token; or the hub could not be reached / refused. The local
        export is untouched in every case (publishing only reads it).
    """
    out_dir = resolve_export_dir(name_or_path, exports_dir)
    _check_publishable(out_dir, repo_id, allow_unknown_license)
    token = token or os.environ.get("HF_TOKEN") or None
    if not token:
        raise ExportError(
            "no Hugging Face token: set HF_TOKEN in the environment (a write token of the target organization); "
            f"the local export at {out_dir} is unchanged"
        )
    from huggingface_hub import HfApi

    api = HfApi(endpoint=endpoint, token=token)
    try:
        api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
        info = api.upload_folder(
            folder_path=str(out_dir),
            repo_id=repo_id,
            repo_type="dataset",
            allow_patterns=PUBLISH_PATTERNS,
            commit_message=f"Upload {out_dir.name} (ror_annotate export)",
        )
    except Exception as exc:  # noqa: BLE001 - network, offline mode, auth, permissions: one coded error for the user
        reason = str(exc).replace(token, "***") if token else str(exc)
        raise ExportError(
            f"could not publish {out_dir} to the hub dataset {repo_id} ({type(exc).__name__}: {reason.splitlines()[0] if reason else ''}); "
            f"check the network, HF_TOKEN's write access and HF_HUB_OFFLINE. The local export at {out_dir} is unchanged"
        ) from None
    return str(getattr(info, "commit_url", info))


#: Code of a dataset card whose metadata the hub would reject (found by ``ror publish --dry-run``).
BAD_CARD = "E815"
#: The hub's ``size_categories`` values (https://huggingface.co/docs/hub/datasets-cards).
SIZE_CATEGORIES = frozenset({
    "n<1K", "1K<n<10K", "10K<n<100K", "100K<n<1M", "1M<n<10M", "10M<n<100M", "100M<n<1B", "1B<n<10B",
    "10B<n<100B", "100B<n<1T", "n>1T",
})


@dataclass
class PublishPlan:
    """What :func:`publish_export` would upload, found without the network (``ror publish --dry-run``).

    Attributes
    ----------
    out_dir : Path
        The export directory.
    repo_id : str
        The target ``ORG/NAME``.
    files : list of (str, int)
        Relative path (POSIX) and size in bytes of every file that would be uploaded, sorted by path.
    card : dict
        The card's metadata (YAML header), as validated.
    """

    out_dir: Path
    repo_id: str
    files: list[tuple[str, int]]
    card: dict[str, Any]

    @property
    def total_bytes(self) -> int:
        """Bytes that would be uploaded."""
        return sum(size for _, size in self.files)


def _publish_files(out_dir: Path) -> list[tuple[str, int]]:
    """Files of ``out_dir`` that ``upload_folder(allow_patterns=PUBLISH_PATTERNS)`` sends (its own filter)."""
    from huggingface_hub.utils import filter_repo_objects

    paths = sorted(p.relative_to(out_dir).as_posix() for p in out_dir.rglob("*") if p.is_file())
    chosen = list(filter_repo_objects(paths, allow_patterns=PUBLISH_PATTERNS))
    return [(p, (out_dir / p).stat().st_size) for p in chosen]


def validate_card(out_dir: Path, files: Sequence[str]) -> dict[str, Any]:  # noqa: C901  (one branch per card metadata field the hub validates)
    """Validate an export's ``README.md`` offline against the hub's dataset-card metadata rules.

    Checks that the YAML header parses (``huggingface_hub.DatasetCard``), that ``license`` is one
    lower-case identifier or a list of them, that ``size_categories`` are hub values, that ``configs``
    pass ``datasets``' own validation (``MetadataConfigs``) and that each of their ``data_files``
    patterns matches a file that is uploaded, and that every ``dataset_info`` config is a declared one.

    Returns
    -------
    dict
        The metadata.

    Raises
    ------
    ExportError
        Code ``E815``, naming the field and what is wrong with it.
    """
    import fnmatch
    import re

    from huggingface_hub import DatasetCard

    readme = out_dir / "README.md"

    def bad(what: str) -> ExportError:
        return ExportError(f"{readme}: the dataset card's metadata would be rejected by the hub: {what}; re-export to rewrite it", code=BAD_CARD)

    if not readme.is_file():
        raise bad("there is no README.md")
    try:
        card = DatasetCard.load(readme)
        data = card.data.to_dict()
    except Exception as exc:  # noqa: BLE001 - yaml and huggingface_hub raise several types for a bad header
        raise bad(f"the YAML header does not parse ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None
    if not data:
        raise bad("the YAML header is missing or empty")
    licenses = data.get("license")
    for lic in licenses if isinstance(licenses, list) else [licenses]:
        if not isinstance(lic, str) or not re.fullmatch(r"[a-z0-9][a-z0-9.+\-]*", lic):
            raise bad(f"license {lic!r} is not a lower-case licence identifier (e.g. mit, apache-2.0, cc-by-4.0, other)")
    for field_name in ("task_categories", "tags", "language", "size_categories"):
        value = data.get(field_name)
        if value is not None and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise bad(f"{field_name} must be a list of strings, got {value!r}")
    unknown = [v for v in data.get("size_categories") or [] if v not in SIZE_CATEGORIES]
    if unknown:
        raise bad(f"size_categories {unknown} are not hub values ({', '.join(sorted(SIZE_CATEGORIES))})")
    from datasets.utils.metadata import MetadataConfigs

    try:
        configs = MetadataConfigs.from_dataset_card_data(card.data)
    except Exception as exc:  # noqa: BLE001 - datasets raises ValueError/TypeError for a malformed configs field
        raise bad(f"configs: {exc}") from None
    for name, config in configs.items():
        data_files = config.get("data_files") or []
        for entry in data_files if isinstance(data_files, list) else [data_files]:
            patterns = entry.get("path") if isinstance(entry, dict) else entry
            for pattern in patterns if isinstance(patterns, list) else [patterns]:
                if not any(fnmatch.fnmatchcase(f, str(pattern)) for f in files):
                    raise bad(f"config {name!r}: data_files pattern {pattern!r} matches none of the files to upload")
    infos = data.get("dataset_info")
    for info in infos if isinstance(infos, list) else [infos] if infos else []:
        if isinstance(info, dict) and configs and info.get("config_name", "default") not in configs:
            raise bad(f"dataset_info names config {info.get('config_name')!r}, which configs does not declare")
    return data


def plan_publish(
    name_or_path: str | Path, repo_id: str, *, exports_dir: Path | str = "exports", allow_unknown_license: bool = False,
) -> PublishPlan:
    """What :func:`publish_export` would do, checked offline and without a token (``ror publish --dry-run``).

    Parameters
    ----------
    name_or_path, repo_id, exports_dir, allow_unknown_license
        As in :func:`publish_export`.

    Returns
    -------
    PublishPlan
        The files and sizes that would be uploaded and the validated card metadata.

    Raises
    ------
    ExportError
        Everything :func:`publish_export` refuses before uploading (no export, a malformed repo id,
        ``E812`` for a source whose licence does not allow publishing), and ``E815`` for a card the hub
        would reject (:func:`validate_card`).
    """
    out_dir = resolve_export_dir(name_or_path, exports_dir)
    _check_publishable(out_dir, repo_id, allow_unknown_license)
    files = _publish_files(out_dir)
    card = validate_card(out_dir, [f for f, _ in files])
    return PublishPlan(out_dir=out_dir, repo_id=repo_id, files=files, card=card)
