"""Capture throughput and steering overhead, each against a baseline measured in the same run.

- capture: tokens/s of ``capture_router_logits`` (hooks + device->host copy + memory-mapped writes)
  vs tokens/s of the same padded forwards with no hook (baseline);
- steering: generated tokens/s of ``model.generate`` (greedy, KV cache) inside ``steer_routing``
  with a real edit vs without the hook (baseline).

Rounds are interleaved and medians reported, because the machine is shared.

    python benchmarks/bench_steer.py                                  # tiny Qwen3-MoE on CPU
    python benchmarks/bench_steer.py --model /models/Qwen3-30B-A3B --device cuda --dtype bfloat16 \
        --traces 64 --trace-len 1024 --new-tokens 256
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _tokens_dataset(n_traces: int, length: int, vocab: int, seed: int):
    import datasets
    import numpy as np

    from ror_annotate.records import BEHAVIORS

    rng = np.random.default_rng(seed)
    rows = [{"trace_id": f"t{i}", "dataset": "bench", "input_ids": rng.integers(3, vocab - 1, size=length).tolist(),
             "labels": [0] * length, "segment_ids": [0] * length} for i in range(n_traces)]
    features = datasets.Features({
        "trace_id": datasets.Value("string"), "dataset": datasets.Value("string"),
        "input_ids": datasets.Sequence(datasets.Value("int32")),
        "labels": datasets.Sequence(datasets.ClassLabel(names=list(BEHAVIORS))),
        "segment_ids": datasets.Sequence(datasets.Value("int32")),
    })
    return datasets.DatasetDict({"train": datasets.Dataset.from_list(rows, features=features)})


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="checkpoint directory (default: a tiny random Qwen3-MoE)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--traces", type=int, default=16)
    parser.add_argument("--trace-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    import torch

    from ror_annotate.steer.capture import capture_router_logits, forward_router_logits, load_model
    from ror_annotate.steer.families import find_router_sites
    from ror_annotate.steer.steering import RoutingEdit, steer_routing

    if args.model:
        model = load_model(args.model, device=args.device, dtype=args.dtype)
        name = args.model
    else:
        from tests import moe_fixtures

        model = moe_fixtures.build("qwen3_moe").to(args.device)
        name = "tiny qwen3_moe (2 layers, 8 experts, top-2, hidden 32)"
    sites = find_router_sites(model)
    vocab = model.get_input_embeddings().weight.shape[0]
    tokens = _tokens_dataset(args.traces, args.trace_len, vocab, seed=0)
    n_tokens = args.traces * args.trace_len
    print(f"model: {name}; device {args.device}; {len(sites)} MoE layers x {sites[0].n_experts} experts, "
          f"top-{sites[0].top_k}; family {sites[0].family.name}")

    def plain_forwards() -> float:
        ids = tokens["train"]["input_ids"]
        start = time.perf_counter()
        with torch.inference_mode():
            for lo in range(0, len(ids), args.batch_size):
                batch = torch.tensor(ids[lo:lo + args.batch_size], device=args.device)
                model(input_ids=batch, use_cache=False)
        _sync(args.device)
        return n_tokens / (time.perf_counter() - start)

    def capture_once() -> float:
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            capture_router_logits(model, tokens, Path(tmp) / "cap", batch_size=args.batch_size, model_name=name)
            _sync(args.device)
            return n_tokens / (time.perf_counter() - start)

    forward_router_logits(model, [tokens["train"][0]["input_ids"][:8]], sites=sites)  # warm-up
    base, cap = [], []
    for _ in range(args.rounds):
        base.append(plain_forwards())
        cap.append(capture_once())
    b, c = statistics.median(base), statistics.median(cap)
    print(f"capture: {c:,.0f} tokens/s vs plain forward {b:,.0f} tokens/s (ratio {c / b:.2f}); "
          f"median of {args.rounds} interleaved rounds, {n_tokens} tokens per round")

    k = sites[0].top_k
    edit = RoutingEdit.from_sets({s.layer: [0] for s in sites},
                                 {s.layer: list(range(1, 1 + min(k, s.n_experts - k - 1))) for s in sites})
    prompt = torch.tensor([tokens["train"][0]["input_ids"][:32]], device=args.device)

    def generate() -> float:
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt),
                                 max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False,
                                 use_cache=True, pad_token_id=0)
        _sync(args.device)
        return (out.shape[1] - prompt.shape[1]) / (time.perf_counter() - start)

    generate()  # warm-up
    plain, steered = [], []
    for _ in range(args.rounds):
        plain.append(generate())
        with steer_routing(model, edit):
            steered.append(generate())
    p, s = statistics.median(plain), statistics.median(steered)
    print(f"steering: {s:,.1f} generated tokens/s vs unhooked {p:,.1f} tokens/s (ratio {s / p:.2f}, overhead "
          f"{(p / s - 1):+.1%}); greedy, KV cache, {args.new_tokens} new tokens, median of {args.rounds} rounds")


if __name__ == "__main__":
    main()
