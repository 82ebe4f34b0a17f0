"""The exported ``tokens`` dataset configuration, as this stage reads it.

One row per trace: ``trace_id``, ``dataset``, ``model``, ``input_ids`` (int32 sequence on the
subject model's token grid), ``labels`` (``Sequence(ClassLabel(names=BEHAVIORS))``, -1 = ignore),
``segment_ids`` (-1 outside segments), ``offsets`` (``[start, end]`` characters into the rendered
text), ``rendering`` and ``tokenizer``; splits ``train`` / ``validation`` / ``test``. The export
stage writes it with ``save_to_disk`` under ``<export_dir>/tokens/`` and as parquet.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import InputError
from ..records import BEHAVIORS

REQUIRED_COLUMNS: tuple[str, ...] = ("trace_id", "dataset", "input_ids", "labels", "segment_ids")
SPLITS: tuple[str, ...] = ("train", "validation", "test")


def _resolve(path: Path) -> Path:
    if (path / "tokens").is_dir():
        return path / "tokens"
    return path


def load_tokens(path: str | Path) -> Any:
    """Load the ``tokens`` configuration as a ``datasets.DatasetDict``.

    Parameters
    ----------
    path : str or Path
        The export directory (containing ``tokens/``) or the ``tokens`` directory itself, written
        by ``save_to_disk`` or holding parquet files named ``<split>*.parquet`` (directly or in
        ``data/``).

    Returns
    -------
    datasets.DatasetDict
        With at least one of the splits ``train``, ``validation``, ``test``.

    Raises
    ------
    InputError
        If the path does not exist, holds no dataset, or lacks a required column or the
        behavior ``ClassLabel`` names.
    """
    import datasets

    root = _resolve(Path(path))
    if not root.exists():
        raise InputError(f"{root}: no such tokens dataset; run `ror export` first or pass the export directory")
    if (root / "dataset_dict.json").exists() or (root / "dataset_info.json").exists():
        loaded = datasets.load_from_disk(str(root))
        dd = loaded if isinstance(loaded, datasets.DatasetDict) else datasets.DatasetDict({"train": loaded})
    else:
        files = {}
        for split in SPLITS:
            found = sorted(root.glob(f"{split}*.parquet")) or sorted(root.glob(f"data/{split}*.parquet"))
            if found:
                files[split] = [str(f) for f in found]
        if not files:
            raise InputError(f"{root}: neither a save_to_disk dataset nor parquet files named <split>*.parquet "
                             f"for splits {', '.join(SPLITS)}; token-level data comes from `ror export --tokenizer DIR`")
        dd = datasets.load_dataset("parquet", data_files=files)
    check_tokens_features(dd, where=str(root))
    return dd


def check_tokens_features(dd: Any, *, where: str = "tokens dataset") -> None:
    """Raise :class:`InputError` unless ``dd`` has the columns and label names this stage needs."""
    for split, ds in dd.items():
        missing = [c for c in REQUIRED_COLUMNS if c not in ds.column_names]
        if missing:
            raise InputError(f"{where} split {split!r}: missing column(s) {missing}; have {ds.column_names}. "
                             "Pass the 'tokens' configuration of an export")
        feature = ds.features["labels"]
        inner = getattr(feature, "feature", None)
        names = getattr(inner, "names", None)
        if names is not None and tuple(names) != BEHAVIORS:
            raise InputError(f"{where} split {split!r}: label names {names} differ from {list(BEHAVIORS)}")


__all__ = ["REQUIRED_COLUMNS", "SPLITS", "check_tokens_features", "load_tokens"]
