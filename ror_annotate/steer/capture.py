"""Teacher-forced capture of router logits on the exported token grid, streamed to disk.

A capture directory holds

- ``meta.json``: model, family, MoE layer indices, ``n_experts``, ``top_k``, storage dtypes;
- ``logits.bin``: raw router logits before top-k, ``[n_tokens_total, n_layers, n_experts]``
  (float16 by default, float32 on request), C order, appended trace after trace;
- ``selected.bin``: the experts each router selected, ``[n_tokens_total, n_layers, top_k]`` int16;
- ``index.jsonl``: one line per captured trace ``{trace_id, split, dataset, start, n_tokens}``
  (``start`` in tokens into the two arrays).

A line is appended to the index only after the trace's arrays are flushed, so a capture
interrupted at any point resumes cleanly: the arrays are truncated back to what the index
covers and traces already indexed are skipped. :class:`Capture` reads the arrays back as
``numpy.memmap`` views, so corpora larger than RAM work.

Padding: a batch is padded to its longest trace; padded positions are dropped before writing.
With left padding, ``position_ids`` are computed from the attention mask (as ``generate`` does),
so real tokens see the same positions as unbatched; with right padding the real tokens already
occupy positions ``0..n-1``. Both give the unbatched logits for real tokens (tested).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterable, Sequence

import numpy as np

from ..errors import CaptureCheckError, SteerError
from ..options import StageOptions
from . import require_torch
from .checks import FORWARD_CHECK_ROWS, GroupedSelection, check_batch, check_forward, check_layers_found, moe_layers_of
from .families import RouterSite, find_router_sites
from .hooks import RouterHooks

STORE_DTYPES = {"float16": np.float16, "float32": np.float32}
SELECTED_DTYPE = np.int16
RESIDUAL_DTYPE = np.float16


@dataclass
class CaptureMeta:
    """Shape and provenance of a capture directory (``meta.json``).

    Attributes
    ----------
    model : str
        Model path or name.
    family : str
        Router family name.
    layers : list of int
        Decoder layer index of each stored layer (axis 1 of the arrays).
    n_experts, top_k : int
    logits_dtype : str
        ``"float16"`` or ``"float32"``.
    model_dtype : str
        dtype the forward ran in (e.g. ``"torch.bfloat16"``).
    """

    model: str
    family: str
    layers: list[int]
    n_experts: int
    top_k: int
    logits_dtype: str = "float16"
    model_dtype: str = ""
    version: int = 1
    #: Decoder layers whose output (the residual stream after the layer) is stored in ``residual.bin``
    #: ``[n_tokens_total, n_residual_layers, hidden_size]`` float16 (version 2; empty: none stored).
    residual_layers: list[int] = field(default_factory=list)
    hidden_size: int = 0

    def compatible(self, other: "CaptureMeta") -> list[str]:
        """Fields that differ from ``other``, as ``"name (old vs new)"``.

        The dtype of the forward counts too (when both sides recorded it): a capture resumed in
        another dtype would mix float32 and bfloat16 routing in one array under one ``meta.json``.
        """
        keys = ("model", "family", "layers", "n_experts", "top_k", "logits_dtype", "residual_layers")
        diff = [k for k in keys if getattr(self, k) != getattr(other, k)]
        if self.model_dtype and other.model_dtype and self.model_dtype != other.model_dtype:
            diff.append("model_dtype")
        return [f"{k} ({getattr(self, k)!r} vs {getattr(other, k)!r})" for k in diff]


@dataclass
class CaptureReport:
    """What a :func:`capture_router_logits` call did.

    Attributes
    ----------
    captured, skipped : int
        Traces written now / already present (resume).
    tokens : int
        Tokens written now.
    seconds : float
        Wall-clock time of the forwards and writes.
    out_dir : str
    """

    captured: int = 0
    skipped: int = 0
    tokens: int = 0
    seconds: float = 0.0
    out_dir: str = ""
    splits: dict[str, int] = field(default_factory=dict)


class Capture:
    """Read a capture directory back.

    Parameters
    ----------
    path : str or Path
        The capture directory.

    Attributes
    ----------
    meta : CaptureMeta
    index : list of dict
        One entry per trace (``trace_id, split, dataset, start, n_tokens``).
    logits : numpy.memmap of shape (n_tokens_total, n_layers, n_experts)
    selected : numpy.memmap of shape (n_tokens_total, n_layers, top_k), int16

    Raises
    ------
    SteerError
        If the directory is not a capture or its arrays are shorter than the index says.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        meta_path = self.path / "meta.json"
        if not meta_path.exists():
            raise SteerError(f"{self.path}: not a capture directory (no meta.json); run `ror capture` first")
        self.meta = CaptureMeta(**json.loads(meta_path.read_text()))
        self.index = _read_index(self.path / "index.jsonl")
        self._by_id = {row["trace_id"]: row for row in self.index}
        n_total = sum(row["n_tokens"] for row in self.index)
        n_layers, e, k = len(self.meta.layers), self.meta.n_experts, self.meta.top_k
        self.logits = _memmap(self.path / "logits.bin", STORE_DTYPES[self.meta.logits_dtype], (n_total, n_layers, e))
        self.selected = _memmap(self.path / "selected.bin", SELECTED_DTYPE, (n_total, n_layers, k))
        #: ``[n_tokens_total, n_residual_layers, hidden_size]`` float16, or None when not captured.
        self.residual = (_memmap(self.path / "residual.bin", RESIDUAL_DTYPE,
                                 (n_total, len(self.meta.residual_layers), self.meta.hidden_size))
                         if self.meta.residual_layers else None)

    @property
    def n_tokens(self) -> int:
        """Total tokens captured."""
        return int(self.logits.shape[0])

    def __contains__(self, trace_id: str) -> bool:
        return trace_id in self._by_id

    def trace(self, trace_id: str) -> tuple[np.ndarray, np.ndarray]:
        """Arrays of one trace.

        Returns
        -------
        logits : ndarray of shape (n_tokens, n_layers, n_experts)
        selected : ndarray of shape (n_tokens, n_layers, top_k)

        Raises
        ------
        SteerError
            If the trace was not captured.
        """
        row = self._by_id.get(trace_id)
        if row is None:
            raise SteerError(f"trace {trace_id!r} is not in the capture at {self.path}; run `ror capture` on it")
        sl = slice(row["start"], row["start"] + row["n_tokens"])
        return self.logits[sl], self.selected[sl]


def _read_index(path: Path) -> list[dict]:
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    rows = []
    for line_no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            # only a torn last line (crash while appending) is tolerated: it was never committed
            if line_no != len(lines):
                raise SteerError(f"{path}:{line_no}: corrupt index line; delete the capture and run again") from None
    return rows


def _memmap(path: Path, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
    need = int(np.prod(shape)) * np.dtype(dtype).itemsize
    have = path.stat().st_size if path.exists() else 0
    if have < need:
        raise SteerError(f"{path}: {have} bytes but the index needs {need}; the capture is damaged, run it again")
    if need == 0:
        return np.zeros(shape, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=shape)


class _Writer:
    """Append-only writer with crash-safe resume (see the module docstring)."""

    def __init__(self, out_dir: Path, meta: CaptureMeta, *, overwrite: bool) -> None:
        self.out_dir = out_dir
        out_dir.mkdir(parents=True, exist_ok=True)
        meta_path = out_dir / "meta.json"
        if overwrite:
            for name in ("meta.json", "index.jsonl", "logits.bin", "selected.bin", "residual.bin"):
                (out_dir / name).unlink(missing_ok=True)
        if meta_path.exists():
            old = CaptureMeta(**json.loads(meta_path.read_text()))
            diff = old.compatible(meta)
            if diff:
                raise SteerError(f"{out_dir} holds a capture with different {', '.join(diff)} (existing vs this run); "
                                 "choose another --out or pass --overwrite")
        meta_path.write_text(json.dumps(asdict(meta), indent=2))
        self.index = _read_index(out_dir / "index.jsonl")
        self.done = {row["trace_id"] for row in self.index}
        self.n_total = sum(row["n_tokens"] for row in self.index)
        n_layers = len(meta.layers)
        self.logit_row = n_layers * meta.n_experts * np.dtype(STORE_DTYPES[meta.logits_dtype]).itemsize
        self.sel_row = n_layers * meta.top_k * np.dtype(SELECTED_DTYPE).itemsize
        self.res_row = len(meta.residual_layers) * meta.hidden_size * np.dtype(RESIDUAL_DTYPE).itemsize
        self._truncate()
        # rewrite the index without a possibly torn last line
        with (out_dir / "index.jsonl").open("w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(row) + "\n" for row in self.index)
        self.logits_fh = (out_dir / "logits.bin").open("ab")
        self.sel_fh = (out_dir / "selected.bin").open("ab")
        self.res_fh = (out_dir / "residual.bin").open("ab") if self.res_row else None
        self.index_fh = (out_dir / "index.jsonl").open("a", encoding="utf-8")

    def _truncate(self) -> None:
        for name, row_bytes in (("logits.bin", self.logit_row), ("selected.bin", self.sel_row), ("residual.bin", self.res_row)):
            if not row_bytes:
                continue
            path = self.out_dir / name
            need = self.n_total * row_bytes
            have = path.stat().st_size if path.exists() else 0
            if have < need:
                raise SteerError(f"{path}: shorter than its index ({have} < {need} bytes); pass --overwrite")
            if have > need or not path.exists():
                with path.open("ab") as fh:
                    fh.truncate(need)

    def append(self, rows: Sequence[tuple[dict, np.ndarray, np.ndarray, "np.ndarray | None"]]) -> None:
        rows = [(*row, None) if len(row) == 3 else row for row in rows]  # (info, logits, selected[, residual])
        for _, logits, selected, residual in rows:
            self.logits_fh.write(np.ascontiguousarray(logits).tobytes())
            self.sel_fh.write(np.ascontiguousarray(selected).tobytes())
            if self.res_fh is not None and residual is not None:
                self.res_fh.write(np.ascontiguousarray(residual, dtype=RESIDUAL_DTYPE).tobytes())
        for fh in (self.logits_fh, self.sel_fh, self.res_fh):
            if fh is not None:
                fh.flush()
                os.fsync(fh.fileno())
        for info, logits, _, _ in rows:
            entry = {**info, "start": self.n_total, "n_tokens": int(logits.shape[0])}
            self.index_fh.write(json.dumps(entry) + "\n")
            self.n_total += int(logits.shape[0])
            self.done.add(info["trace_id"])
        self.index_fh.flush()

    def close(self) -> None:
        for fh in (self.logits_fh, self.sel_fh, self.res_fh, self.index_fh):
            if fh is not None:
                fh.close()


_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?$")


def check_model_source(path: str | Path) -> tuple[str, bool]:
    """Say what ``--model`` names before transformers sees it, so a typo gets our error, not the hub's.

    Parameters
    ----------
    path : str or Path
        A local checkpoint directory, or a ``name`` / ``org/name`` already in the local cache.

    Returns
    -------
    (str, bool)
        The string to pass to ``from_pretrained`` and whether it is a local folder (``False``: a
        cached name, to be loaded with ``local_files_only=True``: models are never downloaded).

    Raises
    ------
    SteerError
        If a local path does not exist, is not a folder, or has no ``config.json``; or if the
        string is neither an existing folder nor shaped like a model name.
    """
    text = str(path)
    local = Path(text).expanduser()
    if local.exists():
        if not local.is_dir():
            raise SteerError(f"model {text!r} is a file; pass the checkpoint folder (the one with config.json)",
                             code="E901")
        if not (local / "config.json").exists():
            raise SteerError(f"model folder {text!r} has no config.json; is it a transformers checkpoint folder?",
                             code="E901")
        return str(local), True
    if text.startswith((".", "/", "~")) or text.endswith("/") or not _REPO_ID.match(text):
        raise SteerError(f"model folder {text!r} does not exist (looked in {local.resolve()})", code="E901")
    return text, False


def load_model(path: str, *, device: str = "cpu", dtype: str = "auto") -> Any:
    """Load a causal MoE model for capture or steering, with hub kernels off.

    Parameters
    ----------
    path : str
        Local checkpoint directory (or a name already in the local cache).
    device : str
        ``"cpu"``, ``"cuda"``, ``"cuda:1"``...
    dtype : str
        ``"auto"`` (the checkpoint's), ``"float32"``, ``"bfloat16"`` or ``"float16"``.

    Returns
    -------
    transformers.PreTrainedModel
        In eval mode on ``device``.

    Raises
    ------
    SteerError
        If the checkpoint cannot be loaded; code ``E901`` when ``path`` names no model folder
        (:func:`check_model_source`).
    """
    torch = require_torch()
    import transformers

    source, is_local = check_model_source(path)
    torch_dtype = "auto" if dtype == "auto" else getattr(torch, dtype)
    errors = []
    options: dict[str, Any] = {"dtype": torch_dtype} if is_local else {"dtype": torch_dtype, "local_files_only": True}
    autos: tuple[Any, ...] = (transformers.AutoModelForCausalLM, transformers.AutoModelForImageTextToText)
    for auto in autos:
        try:
            model = auto.from_pretrained(source, **options)
            return model.to(device).eval()
        except OSError as exc:
            if not is_local:
                raise SteerError(f"no model folder {path!r} here and no cached copy of a model named {path!r} "
                                 "(models are never downloaded: pass the checkpoint's local folder)",
                                 code="E901") from None
            raise SteerError(f"cannot load model {path!r}: {exc}") from None
        except (ValueError, KeyError) as exc:  # unknown architecture for this auto class: try the next
            errors.append(f"{auto.__name__}: {exc}")
    raise SteerError(f"cannot load model {path!r} as a causal or image-text-to-text LM: {'; '.join(errors)}")


def model_tokenizer(path: str) -> Any:
    """The tokenizer saved with a local checkpoint, or ``None`` when the folder has none.

    Used only to compare vocabularies with the export (:func:`~ror_annotate.steer.tokens.check_model_tokenizer`).
    """
    source, is_local = check_model_source(path)
    if is_local and not any((Path(source) / f).exists() for f in ("tokenizer.json", "tokenizer_config.json")):
        return None
    require_torch()
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(source, **({} if is_local else {"local_files_only": True}))
    except (OSError, ValueError):
        return None


class _SplitRows:
    """Rows of one split of the tokens dataset, read column-wise from Arrow once.

    Reading ``ds[i]`` row by row decodes every feature of every row in Python (most of a capture's
    host time on a small model); here the ids are one flat numpy array sliced per row.
    """

    COLUMNS = ("trace_id", "dataset", "tokenizer", "tokenizer_vocab_sha256")

    def __init__(self, ds: Any) -> None:
        import pyarrow.compute as pc

        # with_format, not select_columns: the latter deep-copies an in-memory table
        table = ds.with_format("arrow", columns=[c for c in (*self.COLUMNS, "input_ids") if c in ds.column_names])[:]
        ids = table.column("input_ids").combine_chunks()
        self.lengths = pc.fill_null(pc.list_value_length(ids), 0).to_numpy(zero_copy_only=False).astype(np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.lengths)])
        self.flat = ids.flatten().to_numpy(zero_copy_only=False)
        self.columns = {c: table.column(c).to_pylist() for c in self.COLUMNS if c in table.column_names}
        self.trace_ids = self.columns["trace_id"]

    def __len__(self) -> int:
        return len(self.trace_ids)

    def row(self, i: int) -> dict:
        """``{trace_id, dataset, input_ids (int64 ndarray), tokenizer..}`` of row ``i``."""
        out = {c: values[i] for c, values in self.columns.items()}
        out["input_ids"] = self.flat[self.starts[i]:self.starts[i + 1]].astype(np.int64)
        return out


def _batches(lengths: Sequence[int], batch_size: int, max_batch_tokens: int | None) -> Iterable[list[int]]:
    """Group row indices sorted by length so padding is small; bounded by rows and padded tokens."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batch: list[int] = []
    for i in order:
        longest = max([lengths[j] for j in batch] + [lengths[i]])
        too_many = max_batch_tokens is not None and batch and longest * (len(batch) + 1) > max_batch_tokens
        if batch and (len(batch) >= batch_size or too_many):
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


def _padded_batch(sequences: Sequence[Sequence[int]], padding_side: str, pad_token_id: int, device: Any) -> dict:
    """Model inputs for one padded batch (``position_ids`` from the mask when left-padded)."""
    torch = require_torch()
    if padding_side not in ("left", "right"):
        raise SteerError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
    longest = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), longest), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), longest), dtype=torch.long)
    for row, seq in enumerate(sequences):
        sl = slice(0, len(seq)) if padding_side == "right" else slice(longest - len(seq), longest)
        ids[row, sl] = torch.as_tensor(np.asarray(seq, dtype=np.int64))
        mask[row, sl] = 1
    kwargs: dict[str, Any] = {"input_ids": ids.to(device), "attention_mask": mask.to(device), "use_cache": False}
    if padding_side == "left":
        kwargs["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0).to(device)
    return kwargs


class _BatchRecorder:
    """Router hook target: writes each router's logits and selections into one device buffer per batch.

    One preallocated ``[batch, seq, n_layers, n_experts]`` buffer in the storage dtype per forward:
    each router's output is converted and copied into its slot on the device (one kernel per layer,
    no host synchronisation), and the whole batch later crosses to the host in one copy, at half
    the bytes of float32 when stored as float16.
    """

    def __init__(self, sites: Sequence[RouterSite], logits_dtype: Any, residual_layers: Sequence[int] = (),
                 hidden_size: int = 0) -> None:
        self.slot = {s.position: i for i, s in enumerate(sites)}
        self.n_experts, self.top_k = sites[0].n_experts, sites[0].top_k
        self.logits_dtype = logits_dtype
        self.logits: Any = None
        self.selected: Any = None
        self.residual: Any = None
        self.residual_slot = {layer: i for i, layer in enumerate(residual_layers)}
        self.hidden_size = hidden_size
        self.shape: tuple[int, int] = (0, 0)

    def start(self, ids: Any, device: Any) -> None:
        """New buffers for a forward over ``ids`` ``[batch, seq]``."""
        torch = require_torch()
        n = len(self.slot)
        batch, seq = int(ids.shape[0]), int(ids.shape[1])
        self.shape = (batch, seq)
        # NaN / -1 where a hook never writes, so the self-checks see a layer that returned nothing
        self.logits = torch.full((batch, seq, n, self.n_experts), float("nan"), dtype=self.logits_dtype, device=device)
        self.selected = torch.full((batch, seq, n, self.top_k), -1, dtype=torch.int16, device=device)
        if self.residual_slot:
            self.residual = torch.full((batch, seq, len(self.residual_slot), self.hidden_size), float("nan"),
                                       dtype=torch.float16, device=device)

    def residual_hook(self, layer: int) -> Callable:
        """Forward hook of decoder layer ``layer``: copies its output hidden states into the buffer."""
        i = self.residual_slot[layer]

        def hook(_module: Any, _args: Any, output: Any) -> None:
            hidden = output[0] if isinstance(output, tuple) else output
            if self.residual is not None:
                self.residual[:, :, i].copy_(hidden.detach().view(*self.shape, -1))

        return hook

    def on_route(self, site: RouterSite, logits: Any, output: tuple) -> None:
        i = self.slot.get(site.position)
        if i is not None and self.logits is not None:
            self.logits[:, :, i].copy_(logits.detach().view(*self.shape, -1))
            self.selected[:, :, i].copy_(output[2].detach().view(*self.shape, -1))


def forward_router_logits(model: Any, sequences: Sequence[Sequence[int]], *, sites: list[RouterSite] | None = None,
                          padding_side: str = "right", pad_token_id: int = 0):
    """Run one padded batch and return router logits and selections of the real tokens.

    Parameters
    ----------
    model : torch.nn.Module
        MoE model of a registered family.
    sequences : sequence of sequence of int
        Token ids, one list per trace (the exact exported ``input_ids``; nothing is added).
    sites : list of RouterSite, optional
        Routers to read (default: all).
    padding_side : {"right", "left"}
    pad_token_id : int

    Returns
    -------
    list of (logits, selected)
        Per sequence: ``logits`` float32 tensor ``[n_tokens, n_layers, n_experts]`` (raw, before
        top-k) and ``selected`` int64 tensor ``[n_tokens, n_layers, top_k]``, on CPU.
    """
    torch = require_torch()
    sites = sites if sites is not None else find_router_sites(model)
    device = next(model.parameters()).device
    kwargs = _padded_batch(sequences, padding_side, pad_token_id, device)
    recorder = _BatchRecorder(sites, torch.float32)
    recorder.start(kwargs["input_ids"], device)
    with torch.inference_mode(), RouterHooks(model, recorder.on_route, sites=sites):
        model(**kwargs)
    logits, selected = recorder.logits.cpu(), recorder.selected.cpu()
    return [(logits[row, sl], selected[row, sl].long())
            for row, sl in enumerate(_real_slices([len(s) for s in sequences], logits.shape[1], padding_side))]


def _real_slices(lengths: Sequence[int], longest: int, padding_side: str) -> list[slice]:
    """Positions of the real tokens of each row of a padded batch."""
    if padding_side == "right":
        return [slice(0, n) for n in lengths]
    return [slice(longest - n, longest) for n in lengths]


class _HostCopy:
    """A device batch on its way to the host: pinned buffers and a CUDA event on a GPU, the tensors on CPU."""

    def __init__(self, logits: Any, selected: Any, residual: Any = None) -> None:
        torch = require_torch()
        self.event = None
        if logits.device.type == "cuda":
            def pinned(t: Any) -> Any:
                host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                host.copy_(t, non_blocking=True)
                return host

            self.logits, self.selected = pinned(logits), pinned(selected)
            self.residual = pinned(residual) if residual is not None else None
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.logits, self.selected = logits.cpu(), selected.cpu()
            self.residual = residual.cpu() if residual is not None else None

    def arrays(self) -> tuple[np.ndarray, np.ndarray, "np.ndarray | None"]:
        """Wait for the copy (GPU) and return numpy views (residual: None when not captured)."""
        if self.event is not None:
            self.event.synchronize()
        return self.logits.numpy(), self.selected.numpy(), (self.residual.numpy() if self.residual is not None else None)


class _BackgroundWriter:
    """Writes batches in a thread so the device runs the next forward meanwhile (GPU only).

    Batches are written in submission order by one thread, so the index stays append-only and a
    crash still leaves a resumable capture. At most ``depth`` batches wait (bounded pinned memory).
    An error in the thread is raised in the caller at the next ``submit`` or at ``close``.
    """

    def __init__(self, writer: "_Writer", *, threaded: bool, depth: int = 2,
                 check: "Callable[[list[dict], np.ndarray, np.ndarray, list[slice]], None] | None" = None) -> None:
        import queue
        import threading

        self.writer = writer
        self.check = check
        self.error: BaseException | None = None
        self.queue: Any = queue.Queue(maxsize=depth) if threaded else None
        self.thread = threading.Thread(target=self._run, name="ror-capture-writer", daemon=True) if threaded else None
        if self.thread is not None:
            self.thread.start()

    def _write(self, job: tuple) -> None:
        infos, copy, slices = job
        logits, selected, residual = copy.arrays()
        if self.check is not None:  # before anything of the batch is written
            self.check(infos, logits, selected, slices)
        self.writer.append([(info, logits[row, sl], selected[row, sl], residual[row, sl] if residual is not None else None)
                            for row, (info, sl) in enumerate(zip(infos, slices))])

    def _run(self) -> None:
        while True:
            job = self.queue.get()
            if job is None:
                return
            if self.error is None:
                try:
                    self._write(job)
                except BaseException as exc:  # surfaced in the caller's thread
                    self.error = exc

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error

    def submit(self, infos: list[dict], copy: _HostCopy, slices: list[slice]) -> None:
        self._raise()
        if self.queue is None:
            self._write((infos, copy, slices))
        else:
            self.queue.put((infos, copy, slices))

    def close(self) -> None:
        if self.thread is not None:
            self.queue.put(None)
            self.thread.join()
        self._raise()


def _embedding_rows(model: Any) -> int | None:
    """Rows of the model's input embedding matrix (its vocabulary size), if it exposes one."""
    try:
        return int(model.get_input_embeddings().weight.shape[0])
    except (AttributeError, TypeError, NotImplementedError):
        return None


def _check_vocab(rows: Sequence[dict], vocab_rows: int | None, split: str) -> None:
    """Refuse token ids the model cannot embed: the export was tokenized for another model."""
    from .tokens import TokenizerProvenance

    if vocab_rows is None:
        return
    for r in rows:
        ids = np.asarray(r["input_ids"], dtype=np.int64)
        outside = ids[(ids < 0) | (ids >= vocab_rows)]
        if outside.size:
            bad = int(outside[0])
            prov = TokenizerProvenance(r.get("tokenizer"), r.get("tokenizer_vocab_sha256"))
            raise SteerError(
                f"{split}: trace {r['trace_id']!r} has token id {bad} but the model embeds ids 0..{vocab_rows - 1}; "
                f"the export was tokenized with {prov.describe()}, not this model's tokenizer. "
                "Re-export with --tokenizer set to this model's directory, or capture with the matching model")


class CaptureOptions(StageOptions):
    """Options of ``ror steer capture`` / :func:`capture_router_logits` (each documented there).

    Their checks (storage dtype, layers, splits) run in :func:`capture_router_logits`, as before.
    """

    stage: ClassVar[str] = "the capture stage"
    model_name: str = ""
    splits: Sequence[str] | None = None
    layers: Sequence[int] | None = None
    batch_size: int = 8
    max_batch_tokens: int | None = 16384
    padding_side: str = "right"
    pad_token_id: int | None = None
    logits_dtype: str = "float16"
    overwrite: bool = False
    limit: int | None = None
    background_writer: bool | None = None
    checks: bool = True
    residual_layers: Sequence[int] | str | None = None


def capture_router_logits(model: Any, tokens: Any, out_dir: str | Path, options: CaptureOptions | None = None, *,
                          progress: Callable[[int], None] | None = None, **kwargs: Any) -> CaptureReport:
    """Capture router logits of every trace of the ``tokens`` dataset into ``out_dir``.

    Parameters
    ----------
    model : torch.nn.Module
        Loaded MoE model (device and dtype as loaded; see :func:`load_model`).
    tokens : datasets.DatasetDict
        The exported ``tokens`` configuration (:func:`~ror_annotate.steer.tokens.load_tokens`).
    out_dir : str or Path
        Capture directory; created, or resumed if it already holds a compatible capture.
    options : CaptureOptions, optional
        The settings below as one model; else they are given as keywords (``**kwargs``), validated
        by :meth:`CaptureOptions.from_options` (an unknown name: ConfigError with the closest one).
    model_name : str
        Recorded in ``meta.json``; resuming with another name is refused.
    splits : sequence of str, optional
        Splits to capture (default: all).
    layers : sequence of int, optional
        Decoder layer indices to store (default: every MoE layer).
    batch_size : int
        Traces per forward.
    max_batch_tokens : int or None
        Upper bound on ``batch * longest`` per forward (memory); a longer single trace still runs.
    padding_side : {"right", "left"}
    pad_token_id : int, optional
        Default: the model config's ``pad_token_id``, else 0 (masked either way).
    logits_dtype : {"float16", "float32"}
        Storage dtype of the logits (float16: 2 bytes per layer per expert per token).
    overwrite : bool
        Delete an existing capture in ``out_dir`` first.
    limit : int, optional
        Capture at most this many new traces (smoke runs).
    progress : callable, optional
        Called with the number of traces finished after each batch.
    background_writer : bool, optional
        Write to disk in a background thread while the next batch runs (default: on CUDA, where the
        device->host copy goes to pinned buffers asynchronously; on CPU the forward and the write
        share the same cores, so it is off).
    residual_layers : sequence of int or "all", optional
        Decoder layers whose output (the residual stream after the layer) is stored too, from the
        same forward, in ``residual.bin`` ``[n_tokens_total, n_residual_layers, hidden_size]`` float16
        (the method's residual-stream probe control); ``"all"`` takes every decoder layer.
    checks : bool
        Run the self-checks of :mod:`ror_annotate.steer.checks` on every batch before it is written
        (default; off only to measure their cost).

    Returns
    -------
    CaptureReport

    Raises
    ------
    SteerError
        Unsupported model, an incompatible existing capture, an unknown layer or split.
    CaptureCheckError
        A self-check failed (E910-E913); the failing batch is not written, and a capture folder this
        call created and left empty is removed.
    """
    import time

    options = CaptureOptions.resolve(options, kwargs)
    o = options
    model_name, splits, layers, batch_size, max_batch_tokens = o.model_name, o.splits, o.layers, o.batch_size, o.max_batch_tokens
    padding_side, pad_token_id, logits_dtype, overwrite, limit = o.padding_side, o.pad_token_id, o.logits_dtype, o.overwrite, o.limit
    background_writer, checks, residual_layers = o.background_writer, o.checks, o.residual_layers
    torch = require_torch()
    if logits_dtype not in STORE_DTYPES:
        raise SteerError(f"logits_dtype must be one of {sorted(STORE_DTYPES)}, got {logits_dtype!r}")
    sites = _capture_sites(model, layers, checks)
    if pad_token_id is None:
        pad_token_id = getattr(getattr(model, "config", None), "pad_token_id", None) or 0
    vocab_rows = _embedding_rows(model)
    layer_modules = decoder_layers(model, sites)
    res_layers = _residual_layers(residual_layers, layer_modules)
    meta = CaptureMeta(model=model_name or getattr(model.config, "_name_or_path", "") or type(model).__name__,
                       family=sites[0].family.name, layers=[s.layer for s in sites], n_experts=sites[0].n_experts,
                       top_k=sites[0].top_k, logits_dtype=logits_dtype, model_dtype=str(next(model.parameters()).dtype),
                       residual_layers=res_layers, hidden_size=_hidden_size(model) if res_layers else 0,
                       version=2 if res_layers else 1)
    splits = list(splits) if splits is not None else list(tokens.keys())
    unknown_splits = [s for s in splits if s not in tokens]
    if unknown_splits:
        raise SteerError(f"splits {unknown_splits} not in the tokens dataset; it has {list(tokens.keys())}")
    created = not Path(out_dir).exists()
    writer = _Writer(Path(out_dir), meta, overwrite=overwrite)
    device = next(model.parameters()).device
    recorder = _BatchRecorder(sites, getattr(torch, logits_dtype), res_layers, meta.hidden_size)
    threaded = device.type == "cuda" if background_writer is None else background_writer
    checker = _batch_checker(model, tokens, splits, writer.done, sites, meta, padding_side, pad_token_id) if checks else None
    background = _BackgroundWriter(writer, threaded=threaded, check=checker)
    report = CaptureReport(out_dir=str(out_dir))
    start = time.perf_counter()
    handles = [layer_modules[layer].register_forward_hook(recorder.residual_hook(layer)) for layer in res_layers]
    try:
        with torch.inference_mode(), RouterHooks(model, recorder.on_route, sites=sites):
            for split in splits:
                split_rows = _SplitRows(tokens[split])
                todo = [i for i, tid in enumerate(split_rows.trace_ids) if tid not in writer.done]
                report.skipped += len(split_rows) - len(todo)
                if limit is not None:
                    todo = todo[: max(0, limit - report.captured)]
                lengths = [int(split_rows.lengths[i]) for i in todo]
                for group in _batches(lengths, batch_size, max_batch_tokens):
                    rows = [split_rows.row(todo[j]) for j in group]
                    empty = [r["trace_id"] for r in rows if not len(r["input_ids"])]
                    if empty:
                        raise SteerError(f"{split}: trace(s) {empty[:3]} have no input_ids; re-export them")
                    _check_vocab(rows, vocab_rows, split)
                    seqs = [r["input_ids"] for r in rows]
                    inputs = _padded_batch(seqs, padding_side, pad_token_id, device)
                    recorder.start(inputs["input_ids"], device)
                    model(**inputs)
                    copy = _HostCopy(recorder.logits, recorder.selected, recorder.residual)
                    slices = _real_slices([len(q) for q in seqs], recorder.shape[1], padding_side)
                    background.submit([{"trace_id": r["trace_id"], "split": split, "dataset": r["dataset"]}
                                       for r in rows], copy, slices)
                    report.captured += len(rows)
                    report.tokens += sum(len(q) for q in seqs)
                    report.splits[split] = report.splits.get(split, 0) + len(rows)
                    if progress is not None:
                        progress(len(rows))
        background.close()
    except CaptureCheckError:
        _drop_if_empty(writer, created)
        raise
    finally:
        for handle in handles:
            handle.remove()
        if background.thread is not None and background.thread.is_alive():
            background.queue.put(None)
            background.thread.join()
        writer.close()
    report.seconds = time.perf_counter() - start
    return report


def _capture_sites(model: Any, layers: Sequence[int] | None, checks: bool) -> list[RouterSite]:
    """The router sites to capture: every MoE layer (checked against the expert count, E911) or ``layers``."""
    sites = find_router_sites(model)
    if checks:
        check_layers_found(moe_layers_of(model), [s.layer for s in sites], family=sites[0].family.name)
    if layers is not None:
        wanted = set(int(x) for x in layers)
        unknown = wanted - {s.layer for s in sites}
        if unknown:
            raise SteerError(f"layers {sorted(unknown)} have no MoE router; MoE layers: {[s.layer for s in sites]}")
        sites = [s for s in sites if s.layer in wanted]
    if len({(s.n_experts, s.top_k) for s in sites}) != 1:
        raise SteerError("MoE layers differ in n_experts/top_k; capture them separately with --layers")
    return sites


def decoder_layers(model: Any, sites: Sequence[RouterSite]) -> dict[int, Any]:
    """Every decoder layer module of the model that holds ``sites`` (dense layers included), by index.

    The layer list is the one the routers live in (``model.layers`` or ``model.language_model.layers``).
    """
    match = re.match(r"(.*?layers)\.\d+(?:\.|$)", sites[0].name)
    if match is None:  # pragma: no cover - every registered family lives under a layers list
        return {}
    pattern = re.compile(re.escape(match.group(1)) + r"\.(\d+)")
    return {int(m.group(1)): module for name, module in model.named_modules() if (m := pattern.fullmatch(name))}


def _residual_layers(spec: "Sequence[int] | str | None", layer_modules: dict[int, Any]) -> list[int]:
    if spec is None:
        return []
    if isinstance(spec, str):
        if spec != "all":
            raise SteerError(f"residual_layers must be a list of decoder layers or 'all', got {spec!r}")
        return sorted(layer_modules)
    wanted = sorted({int(x) for x in spec})
    unknown = [x for x in wanted if x not in layer_modules]
    if unknown:
        raise SteerError(f"residual layers {unknown} are not decoder layers of the model (0..{max(layer_modules)})")
    return wanted


def _hidden_size(model: Any) -> int:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return int(config.hidden_size)


def _batch_checker(model: Any, tokens: Any, splits: Sequence[str], done: set, sites: list[RouterSite], meta: CaptureMeta,
                   padding_side: str, pad_token_id: int) -> Callable[[list[dict], np.ndarray, np.ndarray, list[slice]], None]:
    """The per-batch self-check (E910-E913) of :func:`capture_router_logits`.

    The plain forward of E913 runs here, before the capture's hooks are installed: the first
    :data:`~ror_annotate.steer.checks.FORWARD_CHECK_ROWS` tokens of the first trace still to capture.
    """
    reference: dict[str, np.ndarray] = {}
    for split in splits:
        rows = _SplitRows(tokens[split])
        first = next((i for i, tid in enumerate(rows.trace_ids) if tid not in done and rows.lengths[i]), None)
        if first is not None:
            row = rows.row(first)
            _check_vocab([row], _embedding_rows(model), split)  # a clear error before any forward
            ((ref, _),) = forward_router_logits(model, [list(row["input_ids"])[:FORWARD_CHECK_ROWS]], sites=sites,
                                                padding_side=padding_side, pad_token_id=pad_token_id)
            reference[row["trace_id"]] = ref.numpy()
            break
    kw: dict[str, Any] = {"family": meta.family, "layers": meta.layers, "model_dtype": meta.model_dtype, "storage_dtype": meta.logits_dtype}
    grouped = GroupedSelection.from_sites(sites)  # sigmoid, grouped families: E912 checks their own rule

    def check(infos: list[dict], logits: np.ndarray, selected: np.ndarray, slices: list[slice]) -> None:
        real_logits = np.concatenate([logits[row, sl] for row, sl in enumerate(slices)])
        real_selected = np.concatenate([selected[row, sl] for row, sl in enumerate(slices)])
        check_batch(real_logits, real_selected, top_k=meta.top_k, grouped=grouped, **kw)
        for row, (info, sl) in enumerate(zip(infos, slices)):
            ref = reference.get(info["trace_id"])
            if ref is not None:
                check_forward(logits[row, sl][: len(ref)], ref, trace_id=info["trace_id"], **kw)

    return check


def _drop_if_empty(writer: "_Writer", created: bool) -> None:
    """Remove a capture folder this call created when a self-check failed before anything was indexed."""
    if not created or writer.index:
        return
    writer.close()
    for name in ("meta.json", "index.jsonl", "logits.bin", "selected.bin", "residual.bin"):
        (writer.out_dir / name).unlink(missing_ok=True)
    try:
        writer.out_dir.rmdir()
    except OSError:
        pass


__all__ = ["check_model_source", "model_tokenizer", "Capture", "CaptureMeta", "CaptureReport", "capture_router_logits", "forward_router_logits", "load_model"]
