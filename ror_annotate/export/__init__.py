"""Export the store as a Hugging Face dataset: ``traces``, ``segments`` and (with a tokenizer) ``tokens``.

Layout of an export directory (``exports/<name>/`` by default)::

    <out>/README.md                                  dataset card (YAML: configs, features, splits)
    <out>/ror_export.json                            manifest: parameters, counts, sources and licences, provenance
    <out>/analytics.json                             trace analytics, overall and per trace
    <out>/<config>/                                  save_to_disk layout (train/validation/test)
    <out>/data/<config>/<split>-0000i-of-0000n.parquet

The parquet files follow the Hugging Face hub layout and the card's ``configs:`` YAML points at
them, so ``datasets.load_dataset(str(out), "tokens")``, ``datasets.load_dataset("parquet",
data_files=...)``, ``datasets.load_from_disk(out / "tokens")`` and the hub after
``ror publish`` all give the same typed features (``ClassLabel`` names travel in the parquet
schema metadata, ``shared/pitfalls/DS-02``). Splits without rows are not written.

The package follows the export's seams:

* :mod:`.labels` -- which stored label each segment gets (``label_source``);
* :mod:`.splits` -- train/validation/test by trace;
* :mod:`.columns` -- every column of each configuration declared once (name, feature type, doc, value);
* :mod:`.features` -- typed features and column descriptions, derived from :mod:`.columns`;
* :mod:`.read` -- bounded batches from the store, corrupt rows reported;
* :mod:`.build` -- :func:`export_dataset`, streaming rows to the writers;
* :mod:`.write` -- writers, atomic swap, loading and :func:`publish_export`.
"""

from __future__ import annotations

from .columns import COLUMNS, Column, features_of
from .build import ExportOptions, ExportSummary, export_dataset, percentile_from_counts
from .features import (
    BEHAVIOR_ID,
    COLUMN_DOCS,
    CONFIGS,
    segments_features,
    tokens_features,
    traces_features,
)
from .labels import LABEL_CHOICES, UNLABELED, ChosenLabel, adjudicated_reference, choose_label
from .read import CORRUPT_ROW
from .splits import SPLITS, STRATIFY_KEYS, split_traces
from .write import (
    MANIFEST,
    MAX_SHARD_BYTES,
    PUBLISH_PATTERNS,
    UNKNOWN_LICENSE,
    license_allows_publishing,
    load_export,
    PublishPlan,
    plan_publish,
    publish_export,
    validate_card,
    resolve_export_dir,
)

__all__ = [
    "BEHAVIOR_ID", "COLUMNS", "COLUMN_DOCS", "CONFIGS", "Column", "features_of", "CORRUPT_ROW", "LABEL_CHOICES", "MANIFEST", "MAX_SHARD_BYTES",
    "PUBLISH_PATTERNS", "SPLITS", "STRATIFY_KEYS", "UNKNOWN_LICENSE", "UNLABELED", "ChosenLabel", "ExportOptions", "ExportSummary",
    "adjudicated_reference", "choose_label", "export_dataset", "license_allows_publishing", "load_export",
    "percentile_from_counts", "publish_export", "PublishPlan", "plan_publish", "validate_card", "resolve_export_dir", "segments_features", "split_traces",
    "tokens_features", "traces_features",
]
