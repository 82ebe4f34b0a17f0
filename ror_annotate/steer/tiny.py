"""A tiny random-weight MoE checkpoint with a tokenizer trained on the embedded sample, built offline.

For trying the probe/steer stage without downloading a 30B model: ``ror tiny-model DIR`` writes a
Qwen3-MoE checkpoint (4 decoder layers, 8 routed experts, top-2; head_dim 32, so vLLM's CPU
attention runs it too) whose router weights are redrawn from ``N(0, router_std)`` so routing is far
from uniform, and a byte-level BPE tokenizer trained on the traces with a chat template that opens
``<think>``. The weights are random: the figures it gives exercise the pipeline, they say nothing
about reasoning. Byte-identical for the same options (seeded; no clock in the files).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field

from ..options import Seed, StageOptions

#: Chat template: a user turn, then the assistant's turn opened with ``<think>`` (as DeepSeek-R1 and Qwen3 do).
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>")


class TinyModelOptions(StageOptions):
    """Options of :func:`build_tiny_model` (sizes in units of the model; ``router_std`` is a standard deviation)."""

    stage: ClassVar[str] = "ror tiny-model"
    traces: str | None = Field(None, description="JSONL of traces to train the tokenizer on (default: the embedded sample).")
    vocab_size: int = Field(1024, ge=300, le=65536)
    layers: int = Field(4, ge=1, le=64)
    experts: int = Field(8, ge=2, le=256)
    top_k: int = Field(2, ge=1)
    hidden_size: int = Field(64, ge=32)
    router_std: float = Field(2.0, gt=0.0)
    seed: Seed = 0


def _texts(path: Path) -> list[str]:
    out: list[str] = []
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                rec = json.loads(line)
                out.extend(str(rec[k]) for k in ("problem", "trace", "text", "answer") if rec.get(k))
    return out


def build_tokenizer(texts: list[str], vocab_size: int) -> Any:
    """A byte-level BPE trained on ``texts`` (deterministic), wrapped as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, unk_token=None)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_model(out_dir: str | Path, options: TinyModelOptions | None = None) -> dict[str, Any]:
    """Write a tiny random-weight Qwen3-MoE checkpoint and its tokenizer into ``out_dir``.

    Parameters
    ----------
    out_dir : str or Path
        Created if missing; ``config.json``, ``model.safetensors`` and the tokenizer files are written.
    options : TinyModelOptions, optional

    Returns
    -------
    dict
        ``{"path", "parameters", "vocab_size", "layers", "experts", "top_k"}``.

    Raises
    ------
    SteerError
        torch or transformers is missing (the ``steer`` extra).
    InputError
        The traces file cannot be read.
    """
    from ..errors import InputError
    from ..sample import sample_path
    from . import require_torch

    opts = options or TinyModelOptions()
    torch = require_torch()
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    source = Path(opts.traces) if opts.traces else sample_path()
    try:
        texts = _texts(source)
    except (OSError, ValueError) as exc:
        raise InputError(f"{source}: cannot read traces for the tokenizer ({exc}); give a JSONL file of traces") from None
    tokenizer = build_tokenizer(texts, opts.vocab_size)
    heads = max(1, opts.hidden_size // 32)
    sizes: dict[str, Any] = dict(
        vocab_size=len(tokenizer), hidden_size=opts.hidden_size, num_hidden_layers=opts.layers, num_attention_heads=heads,
        num_key_value_heads=1, head_dim=32, intermediate_size=2 * opts.hidden_size, moe_intermediate_size=opts.hidden_size // 2,
        num_experts=opts.experts, num_experts_per_tok=opts.top_k, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
        max_position_embeddings=32768, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.pad_token_id, tie_word_embeddings=False,
    )
    config = Qwen3MoeConfig(**sizes)
    torch.manual_seed(opts.seed)
    model = Qwen3MoeForCausalLM(config).eval()
    gen = torch.Generator().manual_seed(opts.seed)
    with torch.no_grad():  # routers far from uniform: with the 0.02 initialisation top-k ties are common
        for _name, module in model.named_modules():
            if type(module).__name__.endswith("TopKRouter"):
                module.weight.copy_(torch.randn(module.weight.shape, generator=gen) * opts.router_std)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return {"path": str(out), "parameters": int(sum(p.numel() for p in model.parameters())), "vocab_size": len(tokenizer),
            "layers": opts.layers, "experts": opts.experts, "top_k": opts.top_k}


def write_problems(path: str | Path, traces: str | Path | None = None, limit: int = 4) -> int:
    """Write ``limit`` problems (``{id, problem, answer}``) of the traces file (default: the embedded sample)
    as JSONL for ``ror steer``; returns how many were written."""
    from ..sample import sample_path

    rows: list[dict[str, str]] = []
    with Path(traces or sample_path()).open(encoding="utf-8") as fh:
        for line in fh:
            rec = json.loads(line) if line.strip() else None
            if rec and rec.get("problem"):
                rows.append({"id": rec.get("trace_id", str(len(rows))), "problem": rec["problem"],
                             "answer": rec.get("gold_answer") or rec.get("answer") or ""})
            if len(rows) >= limit:
                break
    Path(path).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return len(rows)


__all__ = ["CHAT_TEMPLATE", "TinyModelOptions", "build_tiny_model", "build_tokenizer", "write_problems"]
