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
``HF_HUB_OFFLINE`` is set or the hub does not answer the project's one hub probe
(:func:`ror_annotate.hub.check_hub`, :data:`~ror_annotate.hub.HUB_PROBE_SECONDS`).

Token counting lives here too: :func:`make_token_counter` turns ``--tokenizer`` into a
:class:`TokenCounter` (a loaded tokenizer's :class:`HFTokenCounter`, or the tokenizer-free
:class:`ApproxTokenCounter`) for the segmenter's cap and ``Segment.n_tokens``.

What the export records about a tokenizer (:func:`public_tokenizer_name`,
:func:`tokenizer_vocab_sha256`) never carries an absolute local path, and the vocabulary hash lets
the steer stage check that the model it runs tokenizes as the export did.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .errors import ConfigError
from .hub import HUB_PROBE_SECONDS, check_hub, hub_offline

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedTokenizerBase

_PATH_PREFIXES = ("/", "~", "./", "../", ".\\", "..\\")


def _looks_like_path(spec: str) -> bool:
    return spec.startswith(_PATH_PREFIXES) or "\\" in spec or spec.endswith(".json") or Path(spec).expanduser().exists()


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
        the hub is off (``HF_HUB_OFFLINE``); the hub refused the name; or the tokenizer is a slow one.
        The message says which, and what to give instead.
    HubUnreachableError
        ``E210`` (a :class:`ConfigError` too): the name is not in the local cache and the hub did not
        answer the probe (:func:`ror_annotate.hub.check_hub`).
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
    if hub_offline():
        raise ConfigError(f"cannot load tokenizer {spec!r}: it is not in the local Hugging Face cache and "
                          f"HF_HUB_OFFLINE is set; {hint}")
    check_hub(f"cannot load tokenizer {spec!r} (not in the local Hugging Face cache)", f"{hint}, or set HF_HUB_OFFLINE=1 to skip the hub")
    try:
        tok = AutoTokenizer.from_pretrained(spec)
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"cannot load tokenizer {spec!r}: {str(exc).splitlines()[0]}; {hint}") from None
    return _require_fast(tok, spec)


# --------------------------------------------------------------------------- token counting
#: Name of the built-in token-count approximation (see :class:`ApproxTokenCounter`).
APPROX_COUNTER_NAME = "approx:regex-v1"


@runtime_checkable
class TokenCounter(Protocol):
    """Counts the tokens of a piece of text.

    Attributes
    ----------
    name : str
        Provenance id stored with every segmentation: a tokenizer name or path, or
        :data:`APPROX_COUNTER_NAME`.
    """

    name: str

    def count(self, text: str) -> int:
        """Number of tokens in ``text`` (no special tokens such as BOS/EOS)."""
        ...


# A counter may also offer ``count_many(texts: list[str]) -> list[int]`` (batched counting);
# the segmenter uses it when present (HFTokenCounter does, through ``encode_batch``).


# cl100k-style pre-tokenization (the regex tiktoken's cl100k_base splits text with before BPE),
# written with stdlib ``re`` classes: letters = [^\W\d_], numbers = \d (runs of at most 3).
_PRETOKEN = re.compile(
    r"'(?i:[sdmt]|ll|ve|re)"
    r"|(?:[^\r\n\w]|_)?[^\W\d_]+"
    r"|\d{1,3}"
    r"| ?(?:[^\s\w]|_)+[\r\n]*"
    r"|\s*[\r\n]+"
    r"|\s+(?!\S)"
    r"|\s+"
)
# Scripts written without spaces, where byte-level BPEs spend about one token per character.
_CJK_CHAR = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff66-\uff9f]")
#: Letters per extra token in a long word (BPE vocabularies hold common words whole; 10 gave
#: the closest total to the DeepSeek-V3 tokenizer on the real traces).
_LETTERS_PER_TOKEN = 10
# Characters per token for a run of symbols (``\frac{``, ``^{(``, ``)**``): BPE merges short
# punctuation runs only partly.
_SYMBOLS_PER_TOKEN = 2


class ApproxTokenCounter:
    """Tokenizer-free approximation of a byte-level BPE token count (``approx:regex-v1``).

    The text is pre-tokenized with the regex of tiktoken's ``cl100k_base`` (words with their
    leading space, digit runs in groups of at most 3, punctuation runs, whitespace). Each
    pre-token counts 1, plus 1 per further ``10`` letters of a long word, plus 1 per further
    ``2`` characters of a symbol run (LaTeX such as ``\\frac{`` splits into several BPE
    tokens), and each CJK character counts as one token.

    This is an estimate for the length profile and the hard cap when the subject model's
    tokenizer is not available. How close it comes to a real BPE on the real traces is
    reported by ``benchmarks/bench_segment.py --compare-tokenizer PATH`` and in the project
    notes. Pass a Hugging Face tokenizer (:func:`make_token_counter`) for exact counts.
    """

    name = APPROX_COUNTER_NAME

    def count(self, text: str) -> int:
        """Approximate token count of ``text``.

        Parameters
        ----------
        text : str
            Any text; an empty string counts 0.

        Returns
        -------
        int
            Estimated number of tokens.
        """
        pieces = _PRETOKEN.findall(text)
        n = len(pieces)
        if _CJK_CHAR.search(text) is None:
            # Fast path: a piece of at most 2 characters never adds (a letter run adds from 11
            # characters on, a symbol run from 3), and without CJK no per-piece CJK scan is needed.
            for piece in pieces:
                if len(piece) > 2:
                    core = piece.strip()
                    if core:
                        if core[-1].isalpha():
                            n += (len(core) - 1) // _LETTERS_PER_TOKEN
                        elif not core[0].isdigit():
                            n += (len(core) - 1) // _SYMBOLS_PER_TOKEN
            return n
        for piece in pieces:
            core = piece.strip()
            if not core:
                continue
            n_cjk = len(_CJK_CHAR.findall(core))
            if n_cjk:
                n += n_cjk - 1
                continue
            if core[-1].isalpha():
                n += (len(core) - 1) // _LETTERS_PER_TOKEN
            elif not core[0].isdigit():
                n += (len(core) - 1) // _SYMBOLS_PER_TOKEN
        return n

    def __repr__(self) -> str:
        return f"ApproxTokenCounter(name={self.name!r})"


class HFTokenCounter:
    """Exact token counts from a Hugging Face fast tokenizer (the ``tokenizers`` library).

    Parameters
    ----------
    tokenizer : tokenizers.Tokenizer
        The Rust tokenizer (``PreTrainedTokenizerFast.backend_tokenizer``).
    name : str
        Provenance name: the Hugging Face model id or the path it was loaded from.

    Notes
    -----
    Each segment is counted on its own with ``add_special_tokens=False``. A byte-level BPE
    may count a word one token differently in context (``"Ġword"`` after a space) than at a
    segment start; the exact per-token grid for exports is computed by the alignment stage on
    the whole trace, not from these counts.
    """

    def __init__(self, tokenizer: Any, *, name: str) -> None:
        self._tokenizer = tokenizer
        self.name = name

    def count(self, text: str) -> int:
        """Number of tokens of ``text`` without special tokens."""
        if not text:
            return 0
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def count_many(self, texts: list[str]) -> list[int]:
        """Token counts of many texts in one call (the Rust tokenizer batches them in parallel)."""
        encodings = self._tokenizer.encode_batch(texts, add_special_tokens=False)
        return [len(enc.ids) for enc in encodings]

    def __repr__(self) -> str:
        return f"HFTokenCounter(name={self.name!r})"


def _count_many(counter: TokenCounter, texts: list[str]) -> list[int]:
    """``counter.count_many(texts)`` when the counter has it, else one ``count`` per text."""
    many = getattr(counter, "count_many", None)
    return list(many(texts)) if many is not None else [counter.count(t) for t in texts]


def make_token_counter(tokenizer: Any = None) -> TokenCounter:
    """Build the token counter for ``--tokenizer``.

    Parameters
    ----------
    tokenizer : str, pathlib.Path, tokenizers.Tokenizer, transformers fast tokenizer or None
        ``None`` (or ``"approx"`` / :data:`APPROX_COUNTER_NAME`) gives the
        :class:`ApproxTokenCounter`. A path to a ``tokenizer.json`` file, a directory holding
        one (or any directory ``AutoTokenizer`` can load), or a Hugging Face model id loads
        that tokenizer (a model id needs hub access or a local cache). A ``tokenizers.Tokenizer``
        or a transformers fast tokenizer object is used as given.

    Returns
    -------
    TokenCounter
        An object with ``.name`` (provenance) and ``.count(text) -> int``.

    Raises
    ------
    ConfigError
        The tokenizer cannot be loaded, or is a slow (pure Python) tokenizer without
        character offsets.
    """
    if tokenizer is None or (isinstance(tokenizer, str) and tokenizer in ("approx", APPROX_COUNTER_NAME)):
        return ApproxTokenCounter()
    if isinstance(tokenizer, (str, Path)):
        return _wrap_tokenizer_object(load_tokenizer(tokenizer), name=str(tokenizer))
    return _wrap_tokenizer_object(tokenizer, name=None)


def _wrap_tokenizer_object(tok: Any, *, name: str | None) -> HFTokenCounter:
    from tokenizers import Tokenizer

    if isinstance(tok, Tokenizer):
        return HFTokenCounter(tok, name=name or f"tokenizers:vocab{tok.get_vocab_size()}")
    backend = getattr(tok, "backend_tokenizer", None)
    if isinstance(backend, Tokenizer):
        return HFTokenCounter(backend, name=name or getattr(tok, "name_or_path", None) or type(tok).__name__)
    raise ConfigError(
        f"tokenizer {type(tok).__name__} is not a Hugging Face fast tokenizer; pass a tokenizers.Tokenizer, "
        "a PreTrainedTokenizerFast, a tokenizer.json path, or a model id with a fast tokenizer"
    )


# --------------------------------------------------------------------------- provenance
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


__all__ = [
    "APPROX_COUNTER_NAME", "HUB_PROBE_SECONDS", "ApproxTokenCounter", "HFTokenCounter", "TokenCounter", "load_tokenizer",
    "make_token_counter", "public_tokenizer_name", "tokenizer_vocab_sha256",
]
