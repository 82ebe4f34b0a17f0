"""The exported ``tokens`` dataset configuration, as this stage reads it.

One row per trace: ``trace_id``, ``dataset``, ``model``, ``input_ids`` (int32 sequence on the
subject model's token grid), ``labels`` (``Sequence(ClassLabel(names=BEHAVIORS))``, -1 = ignore),
``segment_ids`` (-1 outside segments), ``offsets`` (``[start, end]`` characters into the rendered
text), ``rendering`` and ``tokenizer``; splits ``train`` / ``validation`` / ``test``. The export
stage writes it with ``save_to_disk`` under ``<export_dir>/tokens/`` and as parquet.

Tokenizer provenance (:class:`TokenizerProvenance`): ``tokenizer`` holds the tokenizer's name or
path (older exports: only its folder name) and, in newer exports, ``tokenizer_vocab_sha256`` the
sha256 of its vocabulary (:func:`vocab_sha256`). Both are read when present; the hash, when the
export has it, is compared with the model's own tokenizer before its ``input_ids`` are fed to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError, SteerError
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


def vocab_sha256(tokenizer: Any) -> str:
    """sha256 (hex) of a tokenizer's vocabulary, as the export records it: the one definition in
    :func:`ror_annotate.tokenizer.tokenizer_vocab_sha256`."""
    from ..tokenizer import tokenizer_vocab_sha256

    return tokenizer_vocab_sha256(tokenizer)


@dataclass(frozen=True)
class TokenizerProvenance:
    """What an export recorded about the tokenizer that produced its ``input_ids``.

    Attributes
    ----------
    name : str or None
        The ``tokenizer`` column: name or path (older exports: the folder name only).
    vocab_sha256 : str or None
        The ``tokenizer_vocab_sha256`` column (newer exports), see :func:`vocab_sha256`.
    """

    name: str | None = None
    vocab_sha256: str | None = None

    def describe(self) -> str:
        """``'name' (vocabulary sha256 abcdef123456...)`` for error messages."""
        text = repr(self.name) if self.name else "an unrecorded tokenizer"
        return text + (f" (vocabulary sha256 {self.vocab_sha256[:12]}...)" if self.vocab_sha256 else "")


def tokenizer_provenance(dd: Any) -> TokenizerProvenance:
    """Read the tokenizer provenance of a tokens dataset (first row that has it).

    Raises
    ------
    SteerError
        If rows disagree (one export, one tokenizer): the dataset mixes tokenizations.
    """
    names: set[str] = set()
    hashes: set[str] = set()
    for ds in dd.values():
        if "tokenizer" in ds.column_names:
            names.update(v for v in ds.unique("tokenizer") if v)
        if "tokenizer_vocab_sha256" in ds.column_names:
            hashes.update(v for v in ds.unique("tokenizer_vocab_sha256") if v)
    if len(hashes) > 1:
        raise SteerError(f"the tokens dataset mixes {len(hashes)} tokenizer vocabularies ({sorted(names)}); "
                         "re-export it with one --tokenizer", code="E902")
    return TokenizerProvenance(name=sorted(names)[0] if names else None, vocab_sha256=next(iter(hashes), None))


def check_model_tokenizer(dd: Any, tokenizer: Any, *, model: str = "the model") -> TokenizerProvenance:
    """Compare the export's vocabulary hash with the model's tokenizer.

    Parameters
    ----------
    dd : datasets.DatasetDict
        The tokens dataset.
    tokenizer : transformers tokenizer or None
        The model's tokenizer (``None``: nothing to compare).
    model : str
        Named in the error.

    Returns
    -------
    TokenizerProvenance
        What the export recorded.

    Raises
    ------
    SteerError
        Code ``E902`` when the export records a vocabulary hash that differs from the tokenizer's.
    """
    prov = tokenizer_provenance(dd)
    if tokenizer is None or prov.vocab_sha256 is None:
        return prov
    mine = vocab_sha256(tokenizer)
    if mine != prov.vocab_sha256:
        raise SteerError(f"the export was tokenized with {prov.describe()}, but {model}'s tokenizer has vocabulary "
                         f"sha256 {mine[:12]}...: its input_ids would mean other tokens to this model. Re-export with "
                         "--tokenizer set to this model's folder, or capture with the model it was tokenized for",
                         code="E902")
    return prov


__all__ = ["REQUIRED_COLUMNS", "SPLITS", "TokenizerProvenance", "check_model_tokenizer", "check_tokens_features",
           "load_tokens", "tokenizer_provenance", "vocab_sha256"]
