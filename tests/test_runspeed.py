"""The main job's per-process and per-trace costs (issue 26): what the speed changes keep equal."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_spacy_stop_words_cached_per_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from spacy.lang.en.stop_words import STOP_WORDS

    from ror_annotate import segment as seg

    monkeypatch.setenv("ROR_CACHE_DIR", str(tmp_path))
    try:
        seg._spacy_stop_words.cache_clear()
        assert seg._spacy_stop_words() == frozenset(STOP_WORDS)  # read from spaCy, then written
        cache = next(tmp_path.glob("spacy-stop-words-*.json"))
        seg._spacy_stop_words.cache_clear()
        cache.write_text('["only-this"]', encoding="utf-8")
        assert seg._spacy_stop_words() == {"only-this"}  # read from the cache, spaCy not asked
        seg._spacy_stop_words.cache_clear()
        cache.write_text("not json", encoding="utf-8")
        assert seg._spacy_stop_words() == frozenset(STOP_WORDS)  # a broken cache is read past and rewritten
    finally:
        seg._spacy_stop_words.cache_clear()
        seg._sentence_starters.cache_clear()


def test_sentence_enders_cached_equal_spacy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from spacy.pipeline.sentencizer import Sentencizer

    from ror_annotate import segment as seg

    want = "".join(sorted(set(Sentencizer.default_punct_chars) | {"…"}))
    monkeypatch.setenv("ROR_CACHE_DIR", str(tmp_path))
    try:
        for _ in range(2):  # cold (read from spaCy, written), then warm (read from the file)
            seg._spacy_sentence_enders.cache_clear()
            assert seg._spacy_sentence_enders() == want
        assert list(tmp_path.glob("spacy-sentence-enders-*.json"))
    finally:
        seg._spacy_sentence_enders.cache_clear()


def test_segmenting_with_a_warm_cache_does_not_import_spacy(tmp_path: Path) -> None:
    """spaCy (and through it thinc and torch) costs seconds per process; with the lists cached it is not imported."""
    code = ("import sys; from ror_annotate.segment import Segmenter; "
            "segs = Segmenter().segment('Let x be 2. Then Dr. Smith checks it. So x = 2!', 't'); "
            "print(len(segs), 'spacy' in sys.modules)")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ROR_CACHE_DIR": str(tmp_path)}
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, check=True)
    second = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, check=True)
    assert first.stdout.split()[0] == second.stdout.split()[0]  # same segments either way
    assert first.stdout.split()[1] == "True" and second.stdout.split()[1] == "False"


def test_trace_analytics_to_dict_equals_asdict() -> None:
    """The export's per-trace analytics dicts are dataclasses.asdict's (keys, order, values), without the deep copy."""
    import json
    from dataclasses import asdict

    from ror_annotate.analytics import TraceAnalytics

    cases = [
        TraceAnalytics("t1", 3, 40, 1, 12, 0.3, 28, 2, {"planning": 4, "execution": 36}, "42", "41", True, False, True),
        TraceAnalytics("t2", 0, 0, None, None, None, None, None),
    ]
    for a in cases:
        d = a.to_dict()
        assert list(d) == list(asdict(a)) and d == asdict(a)
        assert json.dumps(d, indent=1) == json.dumps(asdict(a), indent=1)
        d["tokens_per_behavior"]["fact"] = 1  # a copy: the analytics object is not changed through it
        assert "fact" not in a.tokens_per_behavior
