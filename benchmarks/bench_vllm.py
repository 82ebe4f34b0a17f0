"""The vLLM engine's cost: capture and steering vs plain vLLM, and vs the HF engine, ratios from one run.

- plain vLLM: greedy generation of ``--requests`` prompts in one continuous batch, measured in a
  child process that never installs the hooks (the true baseline);
- hooked, no edit: the same with the custom ops installed and idle (pass-through);
- steered: an edit of ``--suppress`` experts suppressed and 1 activated on every MoE layer;
- capture: prompt tokens/s of :func:`capture_router_logits_vllm` (prefill only, self-checks on)
  vs plain prefill (``max_tokens=1``) in the child;
- HF engine (tiny model only): ``steer_routing`` + ``generate`` one prompt at a time (as
  ``ror steer --engine hf`` runs) and ``capture_router_logits``;
- bytes per token captured (float16 logits + int16 selections).

Interleaving is not possible across engines here (one LLM per process), so each figure is the
median of ``--rounds`` runs; the machine may be shared: read ratios, not absolute numbers.

    python benchmarks/bench_vllm.py                               # tiny Qwen3-MoE on CPU (CI: seconds to a minute)
    python benchmarks/bench_vllm.py --family glm4_moe             # tiny GLM-4-MoE: sigmoid, grouped top-k steering
    python benchmarks/bench_vllm.py --config qwen3-30b-a3b --dtype bfloat16 --batch-sizes 1,16,64 \\
        --prompt-len 256 --new-tokens 128                          # GPU: real-size architecture, random weights

``--config`` writes the architecture's config.json (from benchmarks/bench_steer.py CONFIGS) and
lets vLLM draw random weights (``load_format="dummy"``): no checkpoint, no download. Targets on a
GPU (issue 28): steering overhead <= 5% at batch 1 and <= 3% at batch 64, capture >= 0.9x plain.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_DISABLE_COMPILE_CACHE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def _checkpoint(args: argparse.Namespace, folder: Path) -> tuple[Path, dict]:
    """A checkpoint folder and the LLM options: the tiny test model, or a real-size config with dummy weights."""
    if args.config is None:
        from tests.vllm_worker import make_checkpoint

        return make_checkpoint(args.family, folder / f"tiny-{args.family}"), {}
    import transformers

    from benchmarks.bench_steer import CONFIGS

    cls_name, kwargs = CONFIGS[args.config]
    cfg = getattr(transformers, cls_name)(**kwargs)
    cfg.architectures = [cls_name.replace("Config", "ForCausalLM")]
    out = folder / args.config
    out.mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(out)
    from tests.tokenizers_fixtures import byte_level_bpe

    byte_level_bpe().save_pretrained(out)
    return out, {"load_format": "dummy"}


def _prompts(n: int, length: int, seed: int = 0) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    return [[rng.randrange(3, 300) for _ in range(length)] for _ in range(n)]


def _timed(rounds: int, fn, *args, **kwargs) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn(*args, **kwargs)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _prefill(llm, ids: list[list[int]], params) -> None:
    """Prompts through the model once (``max_tokens=1``), a fresh cache salt each call: no prefix-cache hit."""
    from vllm.inputs import TokensPrompt

    llm.generate([TokensPrompt(prompt_token_ids=p, cache_salt=f"{i}-{time.time()}") for i, p in enumerate(ids)],
                 params, use_tqdm=False)


def plain(args: argparse.Namespace, ckpt: Path, extra: dict) -> dict:
    """Child process: vLLM without the hooks; generation and prefill tokens/s per batch size."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=str(ckpt), dtype=args.dtype, enforce_eager=args.eager, max_num_seqs=max(args.batch_sizes),
              max_model_len=args.prompt_len + args.new_tokens + 8, seed=0, **extra)
    out = {}
    for b in args.batch_sizes:
        prompts = [TokensPrompt(prompt_token_ids=p) for p in _prompts(b, args.prompt_len)]
        gen = SamplingParams(max_tokens=args.new_tokens, temperature=0.0, ignore_eos=True)
        pre = SamplingParams(max_tokens=1, temperature=0.0)
        llm.generate(prompts, gen, use_tqdm=False)  # warm-up
        out[f"gen_{b}"] = b * args.new_tokens / _timed(args.rounds, llm.generate, prompts, gen, use_tqdm=False)
        _prefill(llm, _prompts(b, args.prompt_len), pre)  # warm-up
        out[f"prefill_{b}"] = b * args.prompt_len / _timed(args.rounds, _prefill, llm, _prompts(b, args.prompt_len), pre)
    if args.tensor_parallel_size > 1:  # the ranks' processes exit with the engine (os._exit would orphan them)
        llm.llm_engine.engine_core.shutdown()
    return out


def hooked(args: argparse.Namespace, ckpt: Path, extra: dict) -> dict:
    """This process: the engine with hooks; idle, steered, capture."""
    import datasets
    import numpy as np
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from ror_annotate.steer.steering import RoutingEdit
    from ror_annotate.steer.vllm_engine import _set_edit, build_llm, capture_router_logits_vllm

    engine = build_llm(ckpt, dtype=args.dtype, enforce_eager=args.eager, max_num_seqs=max(args.batch_sizes),
                       max_model_len=args.prompt_len + args.new_tokens + 8, **extra)
    site = engine.sites[0]
    edit = RoutingEdit.from_sets({s.layer: [s.n_experts - 1] for s in engine.sites},
                                 {s.layer: list(range(args.suppress)) for s in engine.sites})
    out: dict = {"n_layers": len(engine.sites), "n_experts": site.n_experts, "top_k": site.top_k,
                 "bytes_per_token": len(engine.sites) * (site.n_experts * 2 + site.top_k * 2)}
    for b in args.batch_sizes:
        prompts = [TokensPrompt(prompt_token_ids=p) for p in _prompts(b, args.prompt_len)]
        gen = SamplingParams(max_tokens=args.new_tokens, temperature=0.0, ignore_eos=True)
        engine.llm.generate(prompts, gen, use_tqdm=False)
        for name, e in (("idle", None), ("steered", edit)):
            _set_edit(engine, e, "always")
            out[f"{name}_{b}"] = b * args.new_tokens / _timed(args.rounds, engine.llm.generate, prompts, gen, use_tqdm=False)
            _set_edit(engine, None, "always")
        pre = SamplingParams(max_tokens=1, temperature=0.0)
        _prefill(engine.llm, _prompts(b, args.prompt_len), pre)
        out[f"idle_prefill_{b}"] = b * args.prompt_len / _timed(args.rounds, _prefill, engine.llm, _prompts(b, args.prompt_len), pre)
        rows = [{"trace_id": f"t{i}", "dataset": "bench", "input_ids": p} for i, p in enumerate(_prompts(b, args.prompt_len))]
        dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)})
        with tempfile.TemporaryDirectory() as tmp:
            out[f"capture_{b}"] = b * args.prompt_len / _timed(args.rounds, capture_router_logits_vllm, engine, dd, Path(tmp) / "cap",
                                                               overwrite=True, batch_size=b, reference=False)
            size = sum(f.stat().st_size for f in (Path(tmp) / "cap").glob("*.bin"))
            out["bytes_per_token_on_disk"] = size / (b * args.prompt_len)
    del np
    if args.tensor_parallel_size > 1:
        engine.close()
    return out


def hf_engine(args: argparse.Namespace, ckpt: Path) -> dict:
    """The HF engine on the same tiny checkpoint: steered generate one prompt at a time; capture."""
    import datasets
    import torch

    from ror_annotate.steer.capture import capture_router_logits, load_model
    from ror_annotate.steer.steering import RoutingEdit, steer_routing

    model = load_model(str(ckpt), dtype=args.dtype if args.dtype != "auto" else "float32")
    sites_layers = [0, 1]
    edit = RoutingEdit.from_sets({layer: [7] for layer in sites_layers}, {layer: list(range(args.suppress)) for layer in sites_layers})
    b = max(args.batch_sizes)
    prompts = _prompts(b, args.prompt_len)

    def gen() -> None:
        with steer_routing(model, edit), torch.inference_mode():
            for p in prompts:
                ids = torch.tensor([p])
                model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new_tokens,
                               min_new_tokens=args.new_tokens, do_sample=False, pad_token_id=0)

    rows = [{"trace_id": f"t{i}", "dataset": "bench", "input_ids": p} for i, p in enumerate(prompts)]
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)})
    with tempfile.TemporaryDirectory() as tmp:
        cap = _timed(args.rounds, capture_router_logits, model, dd, Path(tmp) / "c", overwrite=True)
    return {f"hf_steered_{b}": b * args.new_tokens / _timed(args.rounds, gen), f"hf_capture_{b}": b * args.prompt_len / cap}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=None, help="real-size architecture (bench_steer.CONFIGS); default: tiny model")
    parser.add_argument("--family", default="qwen3_moe",
                        help="tiny model family (tests/vllm_worker.py), e.g. glm4_moe for a sigmoid, grouped top-k router")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--batch-sizes", default="1,8", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--requests", type=int, default=None, help="shorthand for --batch-sizes 1,N")
    parser.add_argument("--prompt-len", type=int, default=48)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--suppress", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--eager", action="store_true", help="enforce_eager (default: compiled)")
    parser.add_argument("--plain-child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--tensor-parallel-size", type=int, default=1,
                        help="tensor-parallel ranks of both the plain and the hooked engine (worker processes)")
    args = parser.parse_args()
    if args.requests:
        args.batch_sizes = [1, args.requests]
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_vllm_"))
    ckpt, extra = _checkpoint(args, work)
    if args.tensor_parallel_size > 1:
        extra["tensor_parallel_size"] = args.tensor_parallel_size
        # vLLM's CPU build binds each rank to a NUMA node of its own (as build_llm does for a CPU with fewer nodes)
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    if args.plain_child:
        Path(args.plain_child).write_text(json.dumps(plain(args, ckpt, extra)))
        sys.stdout.flush()
        os._exit(0)
    child_out = work / "plain.json"
    cmd = [sys.executable, __file__, "--plain-child", str(child_out), "--workdir", str(work), "--dtype", args.dtype,
           "--batch-sizes", ",".join(map(str, args.batch_sizes)), "--prompt-len", str(args.prompt_len),
           "--new-tokens", str(args.new_tokens), "--rounds", str(args.rounds), "--family", args.family] \
        + (["--config", args.config] if args.config else []) \
        + (["--eager"] if args.eager else []) + ["--tensor-parallel-size", str(args.tensor_parallel_size)]
    subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = json.loads(child_out.read_text())
    hf = hf_engine(args, ckpt) if args.config is None else {}
    ours = hooked(args, ckpt, extra)
    print(f"model: {args.config or 'tiny ' + args.family}  ({ours['n_layers']} MoE layers x {ours['n_experts']} experts, top-{ours['top_k']}), "
          f"dtype {args.dtype}, {'eager' if args.eager else 'compiled'}, prompt {args.prompt_len}, new {args.new_tokens}, "
          f"tensor parallel {args.tensor_parallel_size}")
    print(f"{'batch':>5} {'plain tok/s':>12} {'idle hooks':>11} {'steered':>9} {'steer/idle':>11} {'prefill tok/s':>14} "
          f"{'capture':>9} {'cap/idle':>9}" + (f" {'HF steered':>11} {'HF capture':>11}" if hf else ""))
    for b in args.batch_sizes:
        g, p = base[f"gen_{b}"], base[f"prefill_{b}"]
        line = (f"{b:>5} {g:>12.1f} {ours[f'idle_{b}'] / g:>10.3f}x {ours[f'steered_{b}'] / g:>8.3f}x "
                f"{ours[f'steered_{b}'] / ours[f'idle_{b}']:>10.3f}x {p:>14.1f} {ours[f'capture_{b}'] / p:>8.3f}x "
                f"{ours[f'capture_{b}'] / ours[f'idle_prefill_{b}']:>8.3f}x")
        if hf and f"hf_steered_{b}" in hf:
            line += f" {hf[f'hf_steered_{b}'] / ours[f'steered_{b}']:>10.3f}x {hf[f'hf_capture_{b}'] / ours[f'capture_{b}']:>10.3f}x"
        print(line)
    print(f"bytes per token captured: {ours['bytes_per_token']} (float16 logits + int16 selections); on disk "
          f"{ours['bytes_per_token_on_disk']:.0f}")
    print("ratios: idle/steered/capture are vs plain vLLM (another process) at the same batch; steer/idle and cap/idle vs the "
          "same engine with idle hooks (same process: the steadier figure on a shared machine); HF columns are HF engine / vLLM engine "
          "(HF generates one prompt at a time, as `ror steer --engine hf` does)")


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # the in-process engine's teardown can hang after a compiled run
