"""Issue 27, `--chat-template`: the reasoning is passed the way each template reads it (inline
`<think>` or a `thinking` / `reasoning_content` / `reasoning` field) and must land in the template's
reasoning part; otherwise the rendering is refused.

The templates below are small hand-written versions of the public ones (GPT-OSS Harmony reads
`thinking`, Qwen3 `reasoning_content`, some vLLM-era templates `reasoning`); the expected strings are
written by hand from them.
"""

from __future__ import annotations

import pytest

from . import tokenizers_fixtures as F
from ror_annotate.align import TokenAligner, render_trace
from ror_annotate.errors import AlignmentError
from ror_annotate.records import Segment, Trace

HARMONY = (
    "{% for m in messages %}{% if m.role == 'assistant' %}<|start|>assistant"
    "{% if m.thinking %}<|channel|>analysis<|message|>{{ m.thinking }}<|end|><|start|>assistant{% endif %}"
    "<|channel|>final<|message|>{{ m.content }}<|return|>"
    "{% else %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{% endif %}{% endfor %}"
)
QWEN3 = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' and m.reasoning_content %}<think>\n{{ m.reasoning_content }}\n</think>\n\n{% endif %}"
    "{{ m.content }}<|im_end|>\n{% endfor %}"
)
REASONING = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['reasoning'] is defined and m['reasoning'] %}<think>{{ m['reasoning'] }}</think>{% endif %}"
    "{{ m['content'] }}<|im_end|>\n{% endfor %}"
)
# reads the field but prints it after the answer, as plain text: the reasoning is not in a reasoning part
MISPLACED = "{% for m in messages %}{{ m.role }}: {{ m.content }}{% if m.thinking %} (notes: {{ m.thinking }}){% endif %}\n{% endfor %}"
# strips everything up to </think> from the content and has no field: the reasoning vanishes
DROPS = "{% for m in messages %}{{ m.role }}: {{ m.content.split('</think>')[-1] | trim }}\n{% endfor %}"

TRACE = Trace(trace_id="t1", text="First, 2 + 2.\nSo 4.", problem="What is 2 + 2?", answer="4")


def _tok(template: str):
    tok = F.byte_level_bpe()
    tok.chat_template = template
    return tok


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (HARMONY, "<|start|>user<|message|>What is 2 + 2?<|end|><|start|>assistant<|channel|>analysis<|message|>"
                  "First, 2 + 2.\nSo 4.<|end|><|start|>assistant<|channel|>final<|message|>4<|return|>"),
        (QWEN3, "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n<think>\nFirst, 2 + 2.\nSo 4.\n</think>\n\n4<|im_end|>\n"),
        (REASONING, "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n<think>First, 2 + 2.\nSo 4.</think>4<|im_end|>\n"),
        (F.CHATML_TEMPLATE, "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n<think>\nFirst, 2 + 2.\nSo 4.\n</think>\n\n4<|im_end|>\n"),
    ],
    ids=["thinking-field", "reasoning_content-field", "reasoning-field", "inline-think"],
)
def test_reasoning_is_passed_the_way_the_template_reads_it(template: str, expected: str) -> None:
    rendered = render_trace(TRACE, _tok(template), "chat_template")
    assert rendered.text == expected
    assert rendered.text[rendered.text_offset : rendered.text_offset + len(TRACE.text)] == TRACE.text
    # the answer never carries think tags as text
    assert "<think>" not in rendered.text.split("final<|message|>")[-1] or "final" not in rendered.text


@pytest.mark.parametrize("template", [MISPLACED, DROPS], ids=["outside-the-reasoning-part", "dropped"])
def test_reasoning_outside_a_reasoning_part_is_refused(template: str) -> None:
    with pytest.raises(AlignmentError, match="t1") as err:
        render_trace(TRACE, _tok(template), "chat_template")
    assert err.value.code in ("E816", "E800")
    if template is MISPLACED:
        assert err.value.code == "E816" and "reasoning part" in err.value.message


def test_token_labels_sit_on_the_analysis_channel_of_a_harmony_template() -> None:
    tok = _tok(HARMONY)
    segs = [Segment(trace_id="t1", segment_index=0, char_start=0, char_end=13, text="First, 2 + 2.", n_tokens=1),
            Segment(trace_id="t1", segment_index=1, char_start=14, char_end=19, text="So 4.", n_tokens=1)]
    out = TokenAligner(tok, rendering="chat_template").align([TRACE], [segs], [[0, 5]])[0]
    text = out.rendered.text
    labelled = [(int(s), int(e)) for (s, e), lab in zip(out.offsets.tolist(), out.labels.tolist()) if lab != -100]
    assert labelled and all(text.index("analysis<|message|>") < s and e <= text.index("<|end|><|start|>assistant<|channel|>final") for s, e in labelled)
