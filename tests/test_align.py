"""Span-to-token alignment: the public-bug-report pitfalls (TOK-01/03/04) with their exact expected
values, and real offline-built tokenizers checked against a brute-force reference of the rule."""

from __future__ import annotations

import re

import numpy as np
import pytest

from . import tokenizers_fixtures as F
from ror_annotate.align import TokenAligner, align_spans, load_tokenizer, render_trace, verify_alignment
from ror_annotate.errors import AlignmentError, ConfigError
from ror_annotate.records import Segment, Trace

# ----------------------------------------------------------------------------- pitfall cases
# Copied from shared/pitfalls/TOK-0*.json (small cases from public bug reports): text, offsets,
# special_tokens_mask, spans (start, end, label), expected span_tokens and token labels (-100 = ignore).
PITFALLS = [
    pytest.param(  # TOK-01: byte-level BPE, several tokens share one emoji's offsets; zero-width 'Ġ'
        "x 😀 y", [[0, 1], [2, 2], [2, 3], [2, 3], [2, 3], [2, 3], [4, 5]], [0] * 7, [[2, 3, 0]],
        [[2, 3, 4, 5]], [-100, -100, 0, 0, 0, 0, -100], id="TOK-01-emoji",
    ),
    pytest.param(
        "Sum ≥ 5", [[0, 3], [4, 4], [4, 5], [4, 5], [4, 5], [6, 6], [6, 7]], [0] * 7, [[0, 3, 1], [4, 5, 2]],
        [[0], [2, 3, 4]], [1, -100, 2, 2, 2, -100, -100], id="TOK-01-geq",
    ),
    pytest.param(  # TOK-03: SentencePiece '▁cat' includes the preceding space
        "the cat", [[0, 0], [0, 3], [3, 7]], [1, 0, 0], [[0, 4, 0], [4, 7, 1]],
        [[1], [2]], [-100, 0, 1], id="TOK-03-trailing-space",
    ),
    pytest.param(
        "the  cat", [[0, 0], [0, 3], [3, 4], [4, 8]], [1, 0, 0, 0], [[0, 3, 0], [5, 8, 1]],
        [[1], [3]], [-100, 0, -100, 1], id="TOK-03-double-space",
    ),
    pytest.param(  # TOK-04: (0,0) special tokens never join a span starting at 0
        " the the", [[0, 0], [0, 4], [5, 8], [0, 0]], [1, 0, 0, 1], [[1, 4, 0], [5, 8, 1]],
        [[1], [2]], [-100, 0, 1, -100], id="TOK-04-specials",
    ),
]


@pytest.mark.parametrize("text, offsets, special, spans, span_tokens, token_labels", PITFALLS)
def test_pitfall_cases(text, offsets, special, spans, span_tokens, token_labels):
    al = align_spans(text, offsets, spans, special_tokens_mask=special, ignore_index=-100)
    assert al.span_tokens() == span_tokens
    assert al.token_labels.tolist() == token_labels
    verify_alignment(text, np.array(offsets), np.array(spans), al, special_tokens_mask=np.array(special))


def test_tok04_overlapping_spans():
    # TOK-04 encoding 1: the second span contains the first; only span_tokens and the single-span labels are checked
    text, offsets, special = "This is a sentence", [[0, 0], [0, 4], [5, 7], [8, 9], [10, 18], [0, 0]], [1, 0, 0, 0, 0, 1]
    al = align_spans(text, offsets, [[0, 4, 0], [0, 18, 1]], special_tokens_mask=special, ignore_index=-100)
    assert al.span_tokens() == [[1], [1, 2, 3, 4]]
    single = align_spans(text, offsets, [[0, 18, 1]], special_tokens_mask=special, ignore_index=-100)
    assert single.token_labels.tolist() == [-100, 1, 1, 1, 1, -100]


def test_straddling_token_is_labeled_by_its_first_character_and_counted():
    # one token "ab c" covers the end of span 0 ("ab") and the start of span 1 ("cd")
    text = "ab cd"
    al = align_spans(text, [[0, 4], [4, 5]], [[0, 2, 3], [3, 5, 5]])
    assert al.token_labels.tolist() == [3, 5]
    assert al.n_straddling == 1
    assert al.straddling.tolist() == [True, False]
    assert al.span_tokens() == [[0], [0, 1]]
    assert al.token_start.tolist() == [0, 0] and al.token_end.tolist() == [1, 2]


def test_uncovered_character_and_bad_offsets_raise():
    with pytest.raises(AlignmentError, match="covered by no token"):
        align_spans("ab cd", [[0, 2]], [[0, 2, 0], [3, 5, 1]], where="trace t1")
    with pytest.raises(AlignmentError, match="outside the text"):
        align_spans("ab", [[0, 3]], [[0, 2, 0]])
    with pytest.raises(AlignmentError, match="not in text order"):
        align_spans("ab cd", [[3, 5], [0, 2]], [[0, 2, 0]])


# ----------------------------------------------------------------------------- real tokenizers
TEXTS = [
    "Let me try. 😀 Wait, is 3.14 right?\n\nSo the answer is 42.",
    "解方程 x + 1 = 2，得到 x = 1。 Hmm, check: $\\frac{a}{b} \\ge 0$ 👍🏽 done.",
    "First  compute ∑ a_i.\tThen ∫ f dx = π.\r\nFinally \\boxed{12}.",
]


def _segments(text: str, trace_id: str = "t") -> list[Segment]:
    """Sentence-like segments by a simple regex (the segmenter is tested elsewhere)."""
    segs = []
    for m in re.finditer(r"[^.!?。\n]+[.!?。]*", text):
        raw = m.group()
        lead = len(raw) - len(raw.lstrip())
        body = raw.strip()
        if body:
            start = m.start() + lead
            segs.append(Segment(trace_id=trace_id, segment_index=len(segs), char_start=start, char_end=start + len(body), text=body, n_tokens=1))
    return segs


def _reference_labels(text, offsets, special, spans):
    """Brute force of the rule, character by character: label of the span holding the token's first non-space char."""
    out = []
    for (ts, te), sp in zip(offsets, special):
        label = -100  # the ignore value of the exported `labels` column (torch's CrossEntropyLoss default)
        if not sp and te > ts:
            first = next((c for c in range(ts, te) if not text[c].isspace()), None)
            if first is not None:
                label = next((lab for s, e, lab in spans if s <= first < e), -100)
        out.append(label)
    return out


@pytest.mark.parametrize("family", sorted(F.ALL))
@pytest.mark.parametrize("rendering", ["raw", "chat_template"])
@pytest.mark.parametrize("text", TEXTS, ids=["emoji", "cjk-latex", "tabs-crlf"])
def test_real_tokenizers_match_the_reference_rule(family, rendering, text):
    tok = F.ALL[family]()
    trace = Trace(trace_id="t", text=text, problem="What is x? 😀", answer="42")
    segs = _segments(text)
    labels = [i % 6 for i in range(len(segs))]
    out = TokenAligner(tok, rendering=rendering).align([trace], [segs], [labels])[0]
    rendered = out.rendered.text
    assert rendered[out.rendered.text_offset : out.rendered.text_offset + len(text)] == text
    # independent recomputation from a fresh encoding of the rendered string
    enc = tok(rendered, add_special_tokens=(rendering == "raw"), return_offsets_mapping=True, return_special_tokens_mask=True)
    assert out.input_ids.tolist() == enc["input_ids"]
    shift = out.rendered.text_offset
    spans = [(s.char_start + shift, s.char_end + shift, lab) for s, lab in zip(segs, labels)]
    special = [m or (i in tok.all_special_ids and i != tok.unk_token_id) for m, i in zip(enc["special_tokens_mask"], enc["input_ids"])]
    assert out.labels.tolist() == _reference_labels(rendered, enc["offset_mapping"], special, spans)
    # every segment's token range decodes back to text containing the segment (byte-level and metaspace decoders
    # are lossless)
    for k, s in enumerate(segs):
        piece = tok.decode(out.input_ids[out.token_start[k] : out.token_end[k]].tolist())
        if family == "wordpiece":  # lower-cased pieces; [UNK] stands for emoji
            for t in tok.convert_ids_to_tokens(out.input_ids[out.token_start[k] : out.token_end[k]].tolist()):
                assert t == "[UNK]" or t.removeprefix("##") in s.text.lower(), (t, s.text)
        else:
            assert s.text in piece, (k, s.text, piece)
    # template tokens outside the reasoning never carry a label
    outside = (out.offsets[:, 1] <= shift) | (out.offsets[:, 0] >= shift + len(text))
    assert (out.labels[outside] == -100).all()


def test_byte_level_emoji_tokens_share_the_label():
    tok = F.byte_level_bpe()
    text = "x 😀 y"
    segs = [Segment(trace_id="t", segment_index=0, char_start=2, char_end=3, text="😀", n_tokens=1)]
    out = TokenAligner(tok).align([Trace(trace_id="t", text=text)], [segs], [[4]])[0]
    emoji = [i for i, (s, e) in enumerate(out.offsets.tolist()) if s <= 2 < e]
    assert len(emoji) >= 2  # the 4 UTF-8 bytes of the emoji are split over several tokens
    assert all(out.labels[i] == 4 for i in emoji)
    assert sorted(np.flatnonzero(out.labels == 4).tolist()) == emoji
    assert out.segment_ids.tolist() == [0 if i in emoji else -1 for i in range(len(out.labels))]


def test_metaspace_bos_and_byte_fallback():
    tok = F.metaspace_bpe()
    text = "the cat 🦀"  # the crab is not in the training corpus: byte fallback
    segs = [
        Segment(trace_id="t", segment_index=0, char_start=0, char_end=3, text="the", n_tokens=1),
        Segment(trace_id="t", segment_index=1, char_start=4, char_end=9, text="cat 🦀", n_tokens=1),
    ]
    out = TokenAligner(tok).align([Trace(trace_id="t", text=text)], [segs], [[0, 1]])[0]
    assert out.input_ids[0] == tok.bos_token_id and out.labels[0] == -100
    pieces = tok.convert_ids_to_tokens(out.input_ids.tolist())
    fallback = [i for i, p in enumerate(pieces) if p.startswith("<0x")]
    assert len(fallback) == 4 and all(out.labels[i] == 1 for i in fallback)  # 4 UTF-8 bytes of 🦀
    # '▁cat' starts at the space before 'cat' yet belongs to segment 1 only
    cat = pieces.index("▁c") if "▁c" in pieces else next(i for i, p in enumerate(pieces) if p.startswith("▁c"))
    assert out.labels[cat] == 1


def test_slow_tokenizer_is_refused():
    from transformers import ByT5Tokenizer

    with pytest.raises(ConfigError, match="slow tokenizer"):
        load_tokenizer(ByT5Tokenizer())


def test_tokenizer_from_local_directory(tmp_path):
    F.byte_level_bpe().save_pretrained(tmp_path / "tok")
    aligner = TokenAligner(str(tmp_path / "tok"))
    # exports are published: a local directory is named by its last component, never by its path
    assert aligner.name == "tok"
    with pytest.raises(ConfigError, match="cannot load tokenizer .*: no such file or directory") as err:
        load_tokenizer(str(tmp_path / "missing"))
    assert "Repo id" not in str(err.value)  # not the hub client's complaint about a path it took for a repo id


def test_tokenizer_name_never_carries_a_local_path(tmp_path):
    from ror_annotate.align import tokenizer_name

    tok = F.byte_level_bpe()
    assert tokenizer_name(tok, "Qwen/Qwen3-30B-A3B") == "Qwen/Qwen3-30B-A3B"  # hub names stay as given
    snap = tmp_path / "hub" / "models--Qwen--Qwen3-30B-A3B" / "snapshots" / "0123abcd"
    snap.mkdir(parents=True)
    assert tokenizer_name(tok, str(snap)) == "Qwen/Qwen3-30B-A3B"  # a hub-cache snapshot is named by its repo
    assert tokenizer_name(tok, str(tmp_path / "my-tok") + "/") == "my-tok"
    assert tokenizer_name(tok, "~/models/my-tok") == "my-tok"
    tok.name_or_path = str(tmp_path / "abs" / "tok-dir")  # an object loaded from a directory
    assert tokenizer_name(tok) == "tok-dir"


def test_chat_template_that_rewrites_the_reasoning_is_refused():
    tok = F.byte_level_bpe()
    tok.chat_template = "{% for m in messages %}{{ m['content'] | upper }}{% endfor %}"
    with pytest.raises(AlignmentError, match="does not appear verbatim"):
        render_trace(Trace(trace_id="t9", text="let me think", problem="q"), tok, "chat_template")
    tok.chat_template = None
    with pytest.raises(ConfigError, match="no chat template"):
        TokenAligner(tok, rendering="chat_template")


def test_segment_not_matching_the_trace_is_reported():
    tok = F.byte_level_bpe()
    seg = Segment(trace_id="t", segment_index=0, char_start=0, char_end=3, text="abc", n_tokens=1)
    with pytest.raises(AlignmentError, match="t#0"):
        TokenAligner(tok).align([Trace(trace_id="t", text="xyz def")], [[seg]], [[0]])


@pytest.mark.parametrize("bad", [6, 7, -1, -101, 2.0, True])
def test_class_ids_outside_the_codebook_are_refused(bad):
    tok = F.ALL["byte_level_bpe"]()
    text = "abc def"
    segs = [Segment(trace_id="t", segment_index=0, char_start=0, char_end=7, text=text, n_tokens=2)]
    with pytest.raises(AlignmentError, match=rf"class id {bad!r} is outside the codebook's 6 classes") as err:
        TokenAligner(tok).align([Trace(trace_id="t", text=text)], [segs], [[bad]])
    assert err.value.code == "E814"
    # a codebook of 8 classes accepts 7; -100 (no label) is always accepted
    assert TokenAligner(tok, n_classes=8).align([Trace(trace_id="t", text=text)], [segs], [[7]])[0].labels.max() == 7
    assert TokenAligner(tok).align([Trace(trace_id="t", text=text)], [segs], [[-100]])[0].labels.max() == -100
    with pytest.raises(AlignmentError, match="1 labels for 2 segments"):
        two = [segs[0], Segment(trace_id="t", segment_index=1, char_start=0, char_end=3, text="abc", n_tokens=1)]
        TokenAligner(tok).align([Trace(trace_id="t", text=text)], [two], [[0]])
