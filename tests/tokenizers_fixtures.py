"""Real tokenizers built offline with the ``tokenizers`` library, for alignment and export tests.

Each builder trains a tiny model on a fixed corpus (deterministic) and wraps it as a
``transformers.PreTrainedTokenizerFast`` with special tokens and a chat template, mirroring the
families subject models use:

* :func:`byte_level_bpe` -- GPT-2 / Qwen style byte-level BPE (one emoji or CJK character spans
  several byte tokens that share the character's offsets), ChatML chat template with ``<think>``.
* :func:`metaspace_bpe` -- Llama / Gemma style SentencePiece-like BPE with the ``▁`` Metaspace
  pre-tokenizer, byte fallback (``<0xF0>`` ...) and a BOS token added by the post-processor.
* :func:`wordpiece` -- BERT style WordPiece with a lower-casing normalizer and ``[CLS] ... [SEP]``.
"""

from __future__ import annotations

from functools import lru_cache

CORPUS = [
    "Let me try to solve this step by step. First, compute 3.14 * 2 = 6.28.",
    "Wait, is that right? Hmm, let me check again: 12 + 30 = 42, so the answer is 42.",
    "The quadratic formula gives x = (-b ± sqrt(b^2 - 4ac)) / 2a. Next I should check the roots.",
    "So the answer is \\boxed{12}. Alternatively, we could restate the problem: find n such that n^2 = 144.",
    "Recall that the sum of angles in a triangle is 180 degrees. Therefore x = 60.",
    "解 方程 x + 1 = 2，得到 x = 1。 答案 是 1 。",
    "Good 😀 result 👍 and ∑ ≥ ∫ π ∞ √ symbols in LaTeX: $\\frac{a}{b}$ and \\( x^2 \\).",
    "planning execution restatement fact reflection conclusion problem answer think",
] * 4

CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}"
)
WORDPIECE_TEMPLATE = "{% for m in messages %}[CLS] {{ m['role'] }}: {{ m['content'] }} [SEP]{% endfor %}"


@lru_cache(maxsize=None)
def _byte_level_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    # Qwen3 adds <think> and </think> as (non-special) added tokens
    from tokenizers import AddedToken

    tok.add_tokens([AddedToken("<think>", special=False), AddedToken("</think>", special=False)])
    return tok.to_str()


def byte_level_bpe():
    """GPT-2/Qwen-style byte-level BPE tokenizer (``PreTrainedTokenizerFast``) with a ChatML template."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_byte_level_tokenizer()),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        chat_template=CHATML_TEMPLATE,
        name_or_path="tiny-byte-level-bpe",
    )


@lru_cache(maxsize=None)
def _metaspace_tokenizer():
    import json

    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    specials = ["<unk>", "<s>", "</s>", "<start_of_turn>", "<end_of_turn>"]
    base = Tokenizer(models.BPE(unk_token="<unk>"))
    base.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=specials, show_progress=False)
    base.train_from_iterator(CORPUS, trainer)
    spec = json.loads(base.to_str())
    vocab = spec["model"]["vocab"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in spec["model"]["merges"]]
    for b in range(256):  # SentencePiece byte fallback pieces, as in Llama/Gemma vocabularies
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True))
    tok.add_special_tokens(specials)
    tok.normalizer = normalizers.Sequence([])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    return tok.to_str()


def metaspace_bpe():
    """Llama/Gemma-style Metaspace BPE with byte fallback and BOS (``PreTrainedTokenizerFast``), Gemma chat template."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_metaspace_tokenizer()),
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        additional_special_tokens=["<start_of_turn>", "<end_of_turn>"],
        chat_template=GEMMA_TEMPLATE,
        name_or_path="tiny-metaspace-bpe",
    )


@lru_cache(maxsize=None)
def _wordpiece_tokenizer():
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=300, special_tokens=specials, show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))],
    )
    return tok.to_str()


def wordpiece():
    """BERT-style WordPiece (``PreTrainedTokenizerFast``) with ``[CLS] ... [SEP]`` and a plain chat template."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_wordpiece_tokenizer()),
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        mask_token="[MASK]",
        chat_template=WORDPIECE_TEMPLATE,
        name_or_path="tiny-wordpiece",
    )


ALL = {"byte_level_bpe": byte_level_bpe, "metaspace_bpe": metaspace_bpe, "wordpiece": wordpiece}
