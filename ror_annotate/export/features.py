"""Typed features of the three configurations of an export, and a description of every column.

Both are derived from :data:`ror_annotate.export.columns.COLUMNS`, where each column is declared
once (name, feature type, documentation, value); this module keeps the names other modules and
users import.

``ClassLabel`` columns hold class ids only: every stored value decodes with ``int2str``. A segment
without a label has a null ``label``; at token level the model-ready ``labels`` column is a plain
integer column with :data:`~ror_annotate.align.IGNORE_INDEX` (-100) for tokens without a label
(what ``torch.nn.CrossEntropyLoss`` and ``transformers.DataCollatorForTokenClassification`` expect),
and the typed names travel in the parallel ``labeled_positions`` / ``labeled_classes`` pair, which
lists only the labelled tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .columns import BEHAVIOR_ID, COLUMNS, CONFIGS, features_of

if TYPE_CHECKING:  # pragma: no cover
    import datasets

#: One line per column of each configuration (the card prints these), from :data:`~.columns.COLUMNS`.
COLUMN_DOCS: dict[str, dict[str, str]] = {config: {c.name: c.doc for c in cols} for config, cols in COLUMNS.items()}


def traces_features() -> "datasets.Features":
    """Features of the ``traces`` configuration (one row per trace: the text the offsets index)."""
    return features_of("traces")


def segments_features() -> "datasets.Features":
    """Features of the ``segments`` configuration (one row per segment)."""
    return features_of("segments")


def tokens_features() -> "datasets.Features":
    """Features of the ``tokens`` configuration (one row per trace; the probe/steer stage reads these names)."""
    return features_of("tokens")


__all__ = ["BEHAVIOR_ID", "COLUMN_DOCS", "CONFIGS", "features_of", "segments_features", "tokens_features", "traces_features"]
