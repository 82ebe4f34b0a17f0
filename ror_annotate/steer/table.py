"""Join a capture with the exported ``tokens`` dataset: one row per labeled token.

Labels, segment ids and token ids come from the dataset (the source of truth); router arrays
come from the capture, addressed by row. Both probe and expert association read this table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..errors import SteerError
from .capture import Capture


@dataclass
class TokenTable:
    """Labeled tokens of some splits, aligned with a capture.

    Attributes
    ----------
    rows : ndarray of shape (n,), int64
        Row of each token in ``capture.logits`` / ``capture.selected``.
    labels : ndarray of shape (n,), int64
        Behavior class id (index into :data:`~ror_annotate.records.BEHAVIORS`).
    split : ndarray of shape (n,), object
        Split name of each token.
    dataset : ndarray of shape (n,), int64
        Index into ``dataset_names``.
    dataset_names : list of str
    segment : ndarray of shape (n,), int64
        Global segment key (unique across traces), for segment-level variants.
    position : ndarray of shape (n,), int64
        Token index in its trace.
    trace_len : ndarray of shape (n,), int64
        Tokens in the token's trace.
    token_id : ndarray of shape (n,), int64
        The token's input id.
    trace_ids : list of str
        Every trace read, in order (also those without labeled tokens).
    segment_base : ndarray of shape (len(trace_ids),), int64
        Global segment key of each trace's segment 0: a token's ``segment_index`` in its trace is
        ``segment - segment_base[t]`` (see :meth:`segment_origin`).
    """

    rows: np.ndarray
    labels: np.ndarray
    split: np.ndarray
    dataset: np.ndarray
    dataset_names: list[str]
    segment: np.ndarray
    position: np.ndarray
    trace_len: np.ndarray
    token_id: np.ndarray
    trace_ids: list[str] = field(default_factory=list)
    segment_base: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def subset(self, mask: np.ndarray) -> "TokenTable":
        """Rows where ``mask`` is true (same dataset names)."""
        return TokenTable(self.rows[mask], self.labels[mask], self.split[mask], self.dataset[mask], self.dataset_names,
                          self.segment[mask], self.position[mask], self.trace_len[mask], self.token_id[mask],
                          self.trace_ids, self.segment_base)

    def segment_origin(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Trace and ``segment_index`` of global segment keys.

        Parameters
        ----------
        keys : ndarray of shape (m,), int64
            Values of :attr:`segment`.

        Returns
        -------
        trace : ndarray of shape (m,), int64
            Index into :attr:`trace_ids`.
        segment_index : ndarray of shape (m,), int64

        Raises
        ------
        SteerError
            The table was built without trace bookkeeping (not by :func:`labeled_tokens`).
        """
        if len(self.trace_ids) == 0:
            raise SteerError("this token table does not record its traces; build it with labeled_tokens()")
        # a trace without segments has the next trace's base: side="right" picks the later one
        trace = np.searchsorted(self.segment_base, keys, side="right") - 1
        return trace, np.asarray(keys, dtype=np.int64) - self.segment_base[trace]

    def __len__(self) -> int:
        return int(self.rows.shape[0])


def labeled_tokens(capture: Capture, tokens: Any, splits: Sequence[str] | None = None) -> TokenTable:
    """Build the :class:`TokenTable` of the labeled tokens (label != -1) of ``splits``.

    Parameters
    ----------
    capture : Capture
    tokens : datasets.DatasetDict
        The ``tokens`` configuration the capture was made from.
    splits : sequence of str, optional
        Default: every split of ``tokens``.

    Raises
    ------
    SteerError
        If a split is not in ``tokens``, a trace is missing from the capture or its token count
        differs (captured from another export), or no labeled token is found.
    """
    splits = list(splits) if splits is not None else list(tokens.keys())
    unknown = [s for s in splits if s not in tokens]
    if unknown:
        raise SteerError(f"splits {unknown} not in the tokens dataset; it has {list(tokens.keys())}")
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("rows", "labels", "dataset", "segment", "position",
                                                           "trace_len", "token_id", "split")}
    names: dict[str, int] = {}
    seg_base = 0
    trace_ids: list[str] = []
    bases: list[int] = []
    for split in splits:
        ds = tokens[split].select_columns(["trace_id", "dataset", "input_ids", "labels", "segment_ids"])
        for rec in ds:
            tid = rec["trace_id"]
            if tid not in capture:
                raise SteerError(f"trace {tid!r} ({split}) is not in the capture at {capture.path}; "
                                 "run `ror capture` on the same export")
            entry = capture._by_id[tid]
            labels = np.asarray(rec["labels"], dtype=np.int64)
            if entry["n_tokens"] != labels.shape[0]:
                raise SteerError(f"trace {tid!r}: {labels.shape[0]} labels but {entry['n_tokens']} captured tokens; "
                                 "the capture comes from another export, capture again")
            keep = np.flatnonzero(labels >= 0)
            d = names.setdefault(rec["dataset"], len(names))
            segs = np.asarray(rec["segment_ids"], dtype=np.int64)
            if segs.shape != labels.shape or (segs[keep] < 0).any():
                raise SteerError(f"trace {tid!r} ({split}): segment_ids do not cover every labeled token; "
                                 "the export is inconsistent, re-export it")
            parts["rows"].append(entry["start"] + keep)
            parts["labels"].append(labels[keep])
            parts["dataset"].append(np.full(keep.shape, d, dtype=np.int64))
            parts["segment"].append(seg_base + segs[keep])
            trace_ids.append(tid)
            bases.append(seg_base)
            seg_base += int(segs.max(initial=-1)) + 1
            parts["position"].append(keep)
            parts["trace_len"].append(np.full(keep.shape, labels.shape[0], dtype=np.int64))
            parts["token_id"].append(np.asarray(rec["input_ids"], dtype=np.int64)[keep])
            parts["split"].append(np.full(keep.shape, split, dtype=object))
    if not parts["rows"] or not sum(len(p) for p in parts["rows"]):
        raise SteerError(f"no labeled tokens (label != -1) in splits {splits} of the tokens dataset")
    cat = {k: np.concatenate(v) for k, v in parts.items()}
    return TokenTable(rows=cat["rows"], labels=cat["labels"], split=cat["split"], dataset=cat["dataset"],
                      dataset_names=list(names), segment=cat["segment"], position=cat["position"],
                      trace_len=cat["trace_len"], token_id=cat["token_id"], trace_ids=trace_ids,
                      segment_base=np.asarray(bases, dtype=np.int64))


__all__ = ["TokenTable", "labeled_tokens"]
