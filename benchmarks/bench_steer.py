"""Capture throughput and steering overhead, each against a baseline measured in the same run.

- steering: generated tokens/s of ``model.generate`` (greedy, KV cache) at each batch size, for
  the unhooked model (baseline), a trivial hook on every router that returns its output unchanged
  (the cost of the hook mechanism itself), ``steer_routing`` with an empty edit and with an edit
  (4 experts suppressed and 1 activated per MoE layer), and the same two through the previous
  implementation (``legacy``: log-softmax + host-built index lists + recompute on every layer and
  row, kept here only as the "before" figure);
- hook cost shape, counted rather than timed (so it means the same on a shared CPU and on a GPU):
  aten ops dispatched per decoded token, and host synchronisations among them
  (``aten._local_scalar_dense``, what ``.item()``, ``bool(t)`` and ``.tolist()`` dispatch to);
- capture: tokens/s of ``capture_router_logits`` (hooks + device->host copy + memory-mapped writes)
  vs the same padded forwards with no hook.

Rounds are interleaved and medians reported, because the machine may be shared.

    python benchmarks/bench_steer.py                       # tiny Qwen3-MoE on CPU (CI smoke run, seconds)
    python benchmarks/bench_steer.py --config qwen3-30b-a3b-cpu --batch-sizes 1,16   # real routing shape, CPU
    python benchmarks/bench_steer.py --config qwen3-30b-a3b --device cuda --dtype bfloat16 \\
        --batch-sizes 1,16 --prompt-len 256 --new-tokens 96 --traces 4 --trace-len 2048
    python benchmarks/bench_steer.py --model /models/Qwen3-30B-A3B --device cuda --dtype bfloat16

``--config`` builds the architecture from a transformers config class with random weights directly
on ``--device`` (no checkpoint, no download): a name from CONFIGS below, or a local config.json.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: Real-size architectures (values of the public config.json files of these checkpoints, written
#: from their model cards; no weights are loaded) and CPU-sized variants that keep the routing
#: shape (MoE layers x experts x top-k) with small hidden sizes.
CONFIGS: dict[str, tuple[str, dict]] = {
    "qwen3-30b-a3b": ("Qwen3MoeConfig", dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=48, num_attention_heads=32,
        num_key_value_heads=4, head_dim=128, moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
        norm_topk_prob=True, max_position_embeddings=40960, rope_theta=1e6, tie_word_embeddings=False)),
    "gpt-oss-20b": ("GptOssConfig", dict(
        vocab_size=201088, hidden_size=2880, intermediate_size=2880, num_hidden_layers=24, num_attention_heads=64,
        num_key_value_heads=8, head_dim=64, num_local_experts=32, num_experts_per_tok=4, sliding_window=128,
        layer_types=["sliding_attention", "full_attention"] * 12, max_position_embeddings=131072)),
    "qwen1.5-moe-a2.7b": ("Qwen2MoeConfig", dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=5632, num_hidden_layers=24, num_attention_heads=16,
        num_key_value_heads=16, moe_intermediate_size=1408, shared_expert_intermediate_size=5632, num_experts=60,
        num_experts_per_tok=4, norm_topk_prob=False, max_position_embeddings=8192)),
    "qwen3-30b-a3b-cpu": ("Qwen3MoeConfig", dict(
        vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=48, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, moe_intermediate_size=32, num_experts=128, num_experts_per_tok=8,
        norm_topk_prob=True, max_position_embeddings=4096)),
    "gpt-oss-20b-cpu": ("GptOssConfig", dict(
        vocab_size=4096, hidden_size=256, intermediate_size=128, num_hidden_layers=24, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, num_local_experts=32, num_experts_per_tok=4, sliding_window=128,
        layer_types=["sliding_attention", "full_attention"] * 12, max_position_embeddings=4096)),
    "qwen1.5-moe-a2.7b-cpu": ("Qwen2MoeConfig", dict(
        vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=24, num_attention_heads=4,
        num_key_value_heads=4, moe_intermediate_size=64, shared_expert_intermediate_size=256, num_experts=60,
        num_experts_per_tok=4, norm_topk_prob=False, max_position_embeddings=4096)),
}


def build_from_config(name: str, device: str, dtype: str):
    """Random-weight model of a named (or config.json) architecture, built on ``device``."""
    import torch
    import transformers

    if name in CONFIGS:
        cls_name, kwargs = CONFIGS[name]
        config = getattr(transformers, cls_name)(**kwargs)
    elif Path(name).exists():
        config = transformers.AutoConfig.from_pretrained(name)
    else:
        raise SystemExit(f"--config {name!r}: not one of {', '.join(CONFIGS)} and not a local config.json")
    torch_dtype = torch.bfloat16 if dtype == "auto" else getattr(torch, dtype)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    _sharpen_routers(model)
    return model.eval(), f"{name} (random weights, {sum(p.numel() for p in model.parameters()) / 1e9:.2f} B params)"


def _sharpen_routers(model, std: float = 0.5) -> None:
    """Random routers are nearly uniform (init std 0.02); make them decisive so edits change routing."""
    import torch

    from ror_annotate.steer.families import find_router_sites

    with torch.no_grad():
        for site in find_router_sites(model):
            site.logits_module.weight.normal_(0.0, std)


def legacy_steer_routing(model, edit):
    """The previous hook, kept as the "before" figure: fp32 log-softmax, host-built index lists,
    recompute on every layer and row, rows mask moved to the device per layer."""
    from ror_annotate.steer.families import find_router_sites, log_probs, route
    from ror_annotate.steer.hooks import RouterHooks
    from ror_annotate.steer.steering import edit_log_probs

    sites = find_router_sites(model)

    def on_route(site, logits, output):
        logp = log_probs(logits)
        act, sup = edit.activate.get(site.layer, ()), edit.suppress.get(site.layer, ())
        if act or sup:
            logp = edit_log_probs(logp, act, sup, edit.eps)
        weights, indices = route(site, logp)
        return (output[0], weights.to(output[1].dtype), indices.to(output[2].dtype))

    return RouterHooks(model, on_route, sites=sites)


def trivial_hooks(model):
    from ror_annotate.steer.hooks import RouterHooks

    return RouterHooks(model, lambda site, logits, output: None)


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


_CLOCK = time.perf_counter


def _use_cpu_clock() -> None:
    """On a CPU shared with other jobs, wall time measures the neighbours: time this process's CPU."""
    global _CLOCK
    _CLOCK = time.process_time


def count_ops(model, prompt, context_factory):
    """aten ops, host syncs and host-built tensors dispatched by one decoding step (KV cache).

    Host syncs: ``aten._local_scalar_dense``. Host-built tensors: ``aten.lift_fresh`` (a tensor
    made from Python data, e.g. a list of expert ids used as an index: on a GPU a host->device copy
    from pageable memory) and explicit device copies (``_to_copy`` with a ``device``).
    """
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Log(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = 0
            self.syncs = 0
            self.host = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = func.overloadpacket.__name__
            self.ops += 1
            self.syncs += name == "_local_scalar_dense"
            self.host += name in ("lift_fresh", "lift_fresh_copy") or (name == "_to_copy" and "device" in kwargs)
            return func(*args, **kwargs)

    import inspect

    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with torch.inference_mode(), context_factory():
        out = model(input_ids=prompt, use_cache=True)
        step = out.logits[:, -1:].argmax(-1)
        with Log() as log:
            model(input_ids=step, use_cache=True, **{key: getattr(out, key)})
    return log.ops, log.syncs, log.host


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--model", help="checkpoint directory")
    source.add_argument("--config", help=f"random-weight architecture: {', '.join(CONFIGS)}, or a config.json")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--traces", type=int, default=16, help="capture: traces per round")
    parser.add_argument("--trace-len", type=int, default=128, help="capture: tokens per trace")
    parser.add_argument("--batch-size", type=int, default=8, help="capture: traces per forward")
    parser.add_argument("--batch-sizes", default="1", help="steering: comma-separated generation batch sizes")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-legacy", action="store_true", help="skip the previous implementation's figures")
    parser.add_argument("--skip-capture", action="store_true")
    parser.add_argument("--threads", type=int, default=1, help="torch threads on CPU (CPU-time figures)")
    args = parser.parse_args()

    import torch

    if not args.device.startswith("cuda"):
        torch.set_num_threads(args.threads)
        _use_cpu_clock()

    from ror_annotate.steer.capture import capture_router_logits, forward_router_logits, load_model
    from ror_annotate.steer.families import find_router_sites
    from ror_annotate.steer.steering import RoutingEdit, steer_routing

    if args.model:
        model = load_model(args.model, device=args.device, dtype=args.dtype)
        name = args.model
    elif args.config:
        start = time.perf_counter()
        model, name = build_from_config(args.config, args.device, args.dtype)
        name += f", built in {time.perf_counter() - start:.1f} s"
    else:
        from tests import moe_fixtures

        model = moe_fixtures.build("qwen3_moe").to(args.device)
        name = "tiny qwen3_moe (2 layers, 8 experts, top-2, hidden 32)"
    sites = find_router_sites(model)
    vocab = model.get_input_embeddings().weight.shape[0]
    clock = "wall time" if args.device.startswith("cuda") else f"process CPU time, {args.threads} torch thread(s)"
    print(f"timing: {clock}")
    print(f"model: {name}; device {args.device}; dtype {next(model.parameters()).dtype}; torch {torch.__version__}; "
          f"{len(sites)} MoE layers x {sites[0].n_experts} experts, top-{sites[0].top_k}; "
          f"family {sites[0].family.name}")

    if not args.skip_capture:
        tokens = _tokens_dataset(args.traces, args.trace_len, vocab, seed=0)
        n_tokens = args.traces * args.trace_len

        def plain_forwards() -> tuple[float, float]:
            ids = tokens["train"]["input_ids"]
            wall, cpu = time.perf_counter(), _CLOCK()
            with torch.inference_mode():
                for lo in range(0, len(ids), args.batch_size):
                    batch = torch.tensor(ids[lo:lo + args.batch_size], device=args.device)
                    model(input_ids=batch, use_cache=False)
            _sync(args.device)
            return n_tokens / (time.perf_counter() - wall), n_tokens / (_CLOCK() - cpu)

        def capture_once() -> tuple[float, float]:
            with tempfile.TemporaryDirectory() as tmp:
                wall, cpu = time.perf_counter(), _CLOCK()
                capture_router_logits(model, tokens, Path(tmp) / "cap", batch_size=args.batch_size,
                                      max_batch_tokens=None, model_name=name)
                _sync(args.device)
                return n_tokens / (time.perf_counter() - wall), n_tokens / (_CLOCK() - cpu)

        forward_router_logits(model, [tokens["train"][0]["input_ids"][:8]], sites=sites)  # warm-up
        base, cap = [], []
        for _ in range(args.rounds):
            base.append(plain_forwards())
            cap.append(capture_once())
        for i, clock_name in enumerate(("wall time (includes the disk writes)", "timing clock")):
            if i == 1 and _CLOCK is time.perf_counter:
                break
            b, c = statistics.median(x[i] for x in base), statistics.median(x[i] for x in cap)
            print(f"capture [{clock_name}]: {c:,.0f} tokens/s vs plain forward {b:,.0f} tokens/s (ratio {c / b:.2f}x); "
                  f"median of {args.rounds} interleaved rounds, {args.traces} x {args.trace_len} tokens, "
                  f"batch {args.batch_size}")

    k = sites[0].top_k
    n_sup = min(4, sites[0].n_experts - k - 1)
    edit = RoutingEdit.from_sets({s.layer: [0] for s in sites}, {s.layer: list(range(1, 1 + n_sup)) for s in sites})
    empty = RoutingEdit()
    variants = {
        "trivial hook": lambda: trivial_hooks(model),
        "steer, empty edit": lambda: steer_routing(model, empty),
        f"steer, edit ({n_sup} suppressed + 1 activated per layer)": lambda: steer_routing(model, edit),
    }
    if not args.no_legacy:
        variants["legacy steer, empty edit"] = lambda: legacy_steer_routing(model, empty)
        variants["legacy steer, edit"] = lambda: legacy_steer_routing(model, edit)
    gen = torch.Generator().manual_seed(1)

    prompt1 = torch.randint(3, vocab - 1, (1, args.prompt_len), generator=gen).to(args.device)
    print("hook cost per decoded token (counted, batch 1): aten ops, host syncs (_local_scalar_dense), "
          "host-built tensors (lift_fresh, device copies)")
    ops0, syncs0, host0 = count_ops(model, prompt1, contextlib.nullcontext)
    print(f"  {'no hook':<52} {ops0:>6} ops {syncs0:>4} syncs {host0:>4} host-built")
    for label, factory in variants.items():
        ops, syncs, host = count_ops(model, prompt1, factory)
        print(f"  {label:<52} {ops:>6} ops {syncs:>4} syncs {host:>4} host-built   "
              f"(+{ops - ops0} ops, +{syncs - syncs0} syncs, +{host - host0} host-built)")

    for batch in [int(b) for b in args.batch_sizes.split(",") if b.strip()]:
        prompt = torch.randint(3, vocab - 1, (batch, args.prompt_len), generator=gen).to(args.device)

        def generate(prompt=prompt, batch=batch) -> float:
            start = _CLOCK()
            with torch.inference_mode():
                out = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt),
                                     max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False,
                                     use_cache=True, pad_token_id=0)
            _sync(args.device)
            return batch * (out.shape[1] - prompt.shape[1]) / (_CLOCK() - start)

        generate()  # warm-up
        times: dict[str, list[float]] = {"no hook": [], **{label: [] for label in variants}}
        for _ in range(args.rounds):
            times["no hook"].append(generate())
            for label, factory in variants.items():
                with factory():
                    times[label].append(generate())
        base = statistics.median(times["no hook"])
        print(f"steering, batch {batch}: generated tokens/s, greedy with KV cache, prompt {args.prompt_len}, "
              f"{args.new_tokens} new tokens, median of {args.rounds} interleaved rounds")
        print(f"  {'no hook':<52} {base:>10,.1f} tok/s")
        for label in variants:
            rate = statistics.median(times[label])
            print(f"  {label:<52} {rate:>10,.1f} tok/s  overhead {base / rate - 1:+.1%}")


if __name__ == "__main__":
    main()
