"""One tokenizer loader for segmentation, alignment/export and steering.

Every stage that counts or aligns tokens loads the subject model's tokenizer through
:func:`load_tokenizer`, so ``ror segment --tokenizer X``, ``ror export --tokenizer X`` and the steer
commands accept the same three forms:

* a local ``tokenizer.json`` file (the ``tokenizers`` library's serialization),
* a local directory (written by ``save_pretrained``, or a model snapshot),
* a Hugging Face model name, resolved from the local cache first.

Only *fast* tokenizers are accepted: the projection of segment labels onto tokens needs the
character offset mapping, which slow (pure Python) tokenizers do not provide.

A name missing from the local cache would make ``transformers`` retry the hub for 24-48 s before
failing when the machine is offline. :func:`load_tokenizer` fails at once instead, with a hint, when
``HF_HUB_OFFLINE`` is set or the hub endpoint does not accept a connection within
:data:`HUB_PROBE_SECONDS`.

What the export records about a tokenizer (:func:`public_tokenizer_name`,
:func:`tokenizer_vocab_sha256`) never carries an absolute local path, and the vocabulary hash lets
the steer stage check that the model it runs tokenizes as the export did.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from .errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedTokenizerBase

#: Seconds to wait for a TCP connection to the hub endpoint before calling it unreachable.
HUB_PROBE_SECONDS = 3.0

_PATH_PREFIXES = ("/", "~", "./", "../", ".\\", "..\\")
_TRUE = {"1", "on", "yes", "true"}


def _looks_like_path(spec: str) -> bool:
    return spec.startswith(_PATH_PREFIXES) or "\\" in spec or spec.endswith(".json") or Path(spec).expanduser().exists()


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def _hub_reachable(timeout: float = HUB_PROBE_SECONDS) -> tuple[bool, str]:
    """Whether a TCP connection to the hub endpoint (``HF_ENDPOINT`` or the client's default) opens."""
    endpoint = os.environ.get("HF_ENDPOINT")
    if not endpoint:
        from huggingface_hub import constants

        endpoint = constants.ENDPOINT
    url = urlparse(endpoint)
    host = url.hostname or ""
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True, endpoint
    except OSError:
        return False, endpoint


def _require_fast(tok: Any, spec: Any) -> "PreTrainedTokenizerBase":
    if not getattr(tok, "is_fast", False):
        raise ConfigError(
            f"the tokenizer {getattr(tok, 'name_or_path', None) or spec!r} ({type(tok).__name__}) is a slow tokenizer "
            "without an offset mapping, so token counts and labels cannot be projected exactly; load its fast version "
            "(AutoTokenizer.from_pretrained(..., use_fast=True)) or give its tokenizer.json"
        )
    return tok


def load_tokenizer(name_or_path: "str | Path | PreTrainedTokenizerBase | Any") -> "PreTrainedTokenizerBase":
    """Load a fast Hugging Face tokenizer from a ``tokenizer.json`` file, a directory or a model name.

    Parameters
    ----------
    name_or_path : str, Path, transformers fast tokenizer or tokenizers.Tokenizer
        A path to a ``tokenizer.json`` file; a directory ``AutoTokenizer`` can load (or that holds a
        ``tokenizer.json``); a model name (``"Qwen/Qwen3-30B-A3B"``), taken from the local Hugging
        Face cache when it is there, else from the hub; or an already-built tokenizer object
        (a ``tokenizers.Tokenizer`` is wrapped in ``PreTrainedTokenizerFast``).

    Returns
    -------
    transformers.PreTrainedTokenizerBase
        A fast tokenizer (``is_fast`` is True), so ``return_offsets_mapping`` works.

    Raises
    ------
    ConfigError
        The path does not exist or holds no loadable tokenizer; the name is not in the local cache and
        the hub is off (``HF_HUB_OFFLINE``) or unreachable; the hub refused the name; or the tokenizer
        is a slow one. The message says which, and what to give instead.
    """
    if not isinstance(name_or_path, (str, Path)):
        from tokenizers import Tokenizer

        if isinstance(name_or_path, Tokenizer):
            from transformers import PreTrainedTokenizerFast

            return PreTrainedTokenizerFast(tokenizer_object=name_or_path)
        return _require_fast(name_or_path, name_or_path)
    spec = str(name_or_path)
    if not spec.strip():
        raise ConfigError("empty tokenizer name; give a tokenizer.json path, a tokenizer directory or a model name")
    if _looks_like_path(spec):
        return _load_local(spec)
    return _load_named(spec)


def _load_local(spec: str) -> "PreTrainedTokenizerBase":
    path = Path(spec).expanduser()
    if path.is_file():
        from transformers import PreTrainedTokenizerFast

        try:
            return PreTrainedTokenizerFast(tokenizer_file=str(path))
        except Exception as exc:  # the Rust loader raises a bare Exception on a malformed file
            raise ConfigError(f"cannot load tokenizer file {spec!r}: {exc}; give a Hugging Face tokenizer.json") from None
    if not path.is_dir():
        raise ConfigError(
            f"cannot load tokenizer {spec!r}: no such file or directory; give a tokenizer.json file, a directory "
            "written by save_pretrained, or a model name that is in your local Hugging Face cache"
        )
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        if (path / "tokenizer.json").is_file():
            return _load_local(str(path / "tokenizer.json"))
        raise ConfigError(f"cannot load tokenizer {spec!r}: {str(exc).splitlines()[0]}") from None
    return _require_fast(tok, spec)


def _load_named(spec: str) -> "PreTrainedTokenizerBase":
    from transformers import AutoTokenizer

    try:
        return _require_fast(AutoTokenizer.from_pretrained(spec, local_files_only=True), spec)
    except (OSError, ValueError, KeyError):
        pass  # not cached: ask the hub, if there is one
    hint = ("give a local tokenizer.json or a directory written by save_pretrained, or fetch the tokenizer once "
            "while online (it is then read from the cache)")
    if _offline():
        raise ConfigError(f"cannot load tokenizer {spec!r}: it is not in the local Hugging Face cache and "
                          f"HF_HUB_OFFLINE is set; {hint}")
    reachable, endpoint = _hub_reachable()
    if not reachable:
        raise ConfigError(f"cannot load tokenizer {spec!r}: it is not in the local Hugging Face cache and the hub "
                          f"({endpoint}) is unreachable; {hint}, or set HF_HUB_OFFLINE=1 to skip the hub")
    try:
        tok = AutoTokenizer.from_pretrained(spec)
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"cannot load tokenizer {spec!r}: {str(exc).splitlines()[0]}; {hint}") from None
    return _require_fast(tok, spec)


def public_tokenizer_name(tok: Any = None, given: Any = None, *, cwd: Path | None = None) -> str:
    """The tokenizer's name as an export records it: never an absolute local path.

    Parameters
    ----------
    tok : tokenizer object, optional
        Its ``name_or_path`` is used when ``given`` is not a string.
    given : str or Path, optional
        What the user passed (a model name, a directory, a ``tokenizer.json``).
    cwd : Path, optional
        Working directory (default: the current one).

    Returns
    -------
    str
        A model name stays as given. A local path inside the working directory is recorded relative to
        it (POSIX separators); a Hugging Face cache snapshot (``.../models--ORG--NAME/snapshots/REV``)
        is named ``ORG/NAME``; any other local path by its last component (the folder holding a
        ``tokenizer.json``).
    """
    name = str(given) if isinstance(given, (str, Path)) else str(getattr(tok, "name_or_path", "") or type(tok).__name__)
    if not _looks_like_path(name):
        return name
    parts = (PureWindowsPath(name) if "\\" in name else PurePosixPath(name)).parts
    for part in parts:
        if part.startswith("models--") and len(part) > len("models--"):
            return part[len("models--") :].replace("--", "/")
    if "\\" not in name:
        path = Path(name).expanduser()
        try:
            rel = path.resolve().relative_to((cwd or Path.cwd()).resolve())
            if rel.parts:
                return rel.as_posix()
        except (ValueError, OSError):
            pass
    tail = [p for p in parts if p not in ("/", "~", ".", "..", "\\") and not p.endswith((":\\", ":/"))]
    if tail and tail[-1] == "tokenizer.json" and len(tail) > 1:
        return tail[-2]
    return tail[-1] if tail else "local-tokenizer"


def tokenizer_vocab_sha256(tok: Any) -> str:
    """sha256 (hex) of a tokenizer's vocabulary: the JSON of its ``(token, id)`` pairs sorted by id.

    ``get_vocab()`` includes added tokens, so two tokenizers with the same hash map every token
    string to the same id. The steer stage compares this with the export's
    ``tokenizer_vocab_sha256`` before it feeds exported ``input_ids`` to a model.

    Raises
    ------
    ConfigError
        The object has no ``get_vocab()``.
    """
    get_vocab = getattr(tok, "get_vocab", None)
    if get_vocab is None:
        raise ConfigError(f"{type(tok).__name__} has no get_vocab(); pass a Hugging Face tokenizer")
    pairs = sorted(get_vocab().items(), key=lambda kv: (kv[1], kv[0]))
    return hashlib.sha256(json.dumps(pairs, ensure_ascii=False, separators=(",", ":")).encode("utf-8")).hexdigest()


__all__ = ["HUB_PROBE_SECONDS", "load_tokenizer", "public_tokenizer_name", "tokenizer_vocab_sha256"]
