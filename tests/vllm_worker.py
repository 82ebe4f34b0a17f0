"""Subprocess body of tests/test_vllm_engine.py: build a tiny checkpoint, run it in vLLM, report as JSON.

Run as ``python tests/vllm_worker.py FAMILY {eager|compiled} WORKDIR``; prints one JSON line prefixed
``RESULT `` with every measured quantity (the test asserts on them). A subprocess because building
an ``LLM`` binds the process's OpenMP threads and seeds its global RNG (../shared/notes/vllm-cpu.md).

Expected values come from an independent source: a plain transformers forward of the same
checkpoint (``output_router_logits``-free: the router modules' own outputs through the HF engine's
hooks, which tests/test_steer_capture.py checks against transformers itself).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TINY = dict(hidden_size=64, head_dim=32, num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512)
#: DeepSeek-V3's MLA: vLLM's CPU MLA kernel only compiles for a latent cache of kv_lora_rank 512 + rope 64
MLA = dict(hidden_size=64, num_attention_heads=2, num_key_value_heads=2, kv_lora_rank=512, q_lora_rank=None,
           qk_rope_head_dim=64, qk_nope_head_dim=32, v_head_dim=32, head_dim=64, qk_head_dim=96, max_position_embeddings=512,
           topk_method="noaux_tc", scoring_func="sigmoid")  # as in DeepSeek-V3's config.json (vLLM reads them)


#: Families whose engine is built with every decoder layer instrumented for residual-stream capture (the others
#: keep the uninstrumented path covered).
RESIDUAL = ("qwen3_moe", "gpt_oss", "glm4_moe")
#: Sigmoid, grouped top-k families (DeepSeek-V3 rule).
GROUPED = ("glm4_moe", "deepseek_v3")


def make_checkpoint(family: str, folder: Path, seed: int = 0) -> Path:
    """Save a tiny random MoE checkpoint of ``family`` (head_dim 32) with a byte-level BPE tokenizer."""
    from tests.moe_fixtures import build
    from tests.tokenizers_fixtures import byte_level_bpe

    if (folder / "config.json").exists():
        return folder
    tok = byte_level_bpe()
    extra = {"intermediate_size": 64} if family == "gpt_oss" else {}  # vLLM's CPU experts need aligned widths
    model = build(family, seed=seed, **extra, vocab_size=len(tok), pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                  bos_token_id=tok.pad_token_id, **(MLA if family == "deepseek_v3" else TINY))
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    """``n`` token sequences of varied lengths 5..60 (ids from the tokenizer's ordinary range)."""
    import random

    rng = random.Random(seed)
    return [[rng.randrange(3, 300) for _ in range(rng.randrange(5, 61))] for _ in range(n)]


def main() -> None:
    family, mode, workdir = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    # "eager" / "compiled", optionally "-tpN": N tensor-parallel ranks (worker processes)
    mode, _, tp = mode.partition("-tp")
    tp_size = int(tp or 1)
    import numpy as np
    import torch

    from ror_annotate.steer.capture import forward_router_logits, load_model
    from ror_annotate.steer.steering import RoutingEdit
    from ror_annotate.steer.vllm_engine import _capture_batch, _workers, build_llm, generate_vllm

    ckpt = make_checkpoint(family, workdir / family)
    seqs = prompts(8)
    hf = load_model(str(ckpt), dtype="float32")
    refs = [forward_router_logits(hf, [s])[0] for s in seqs]
    reference = [r[0].numpy() for r in refs]
    ref_selected = [r[1].numpy() for r in refs]
    grouped = family in GROUPED
    if grouped:  # the transformers router's own rule: groups, bias (the independent reference of the steered selection)
        from ror_annotate.steer.families import find_router_sites

        site0 = find_router_sites(hf)[0]
        rule = dict(n_group=site0.n_group, topk_group=site0.topk_group, top_k=site0.top_k, renorm=site0.renormalize,
                    scaling=site0.scaling)
        bias0 = site0.bias.detach().float().numpy()
    del hf
    extra = {"gpu_memory_utilization": 0.1} if torch.cuda.is_available() else {}
    engine = build_llm(ckpt, dtype="float32", enforce_eager=(mode == "eager"), max_num_seqs=8, max_model_len=512,
                       residual_layers="all" if family in RESIDUAL else None, tensor_parallel_size=tp_size, **extra)
    out: dict = {"ranks": len(_workers(engine, "ror_configure", {})), "family": engine.family, "layers": [s.layer for s in engine.sites],
                 "expected_layers": engine.expected_layers, "n_experts": engine.sites[0].n_experts,
                 "top_k": engine.sites[0].top_k}
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0.0)
    _workers(engine, "ror_configure", {"capture_layers": out["layers"], "capture_dtype": "float32"})
    batch1 = [_capture_batch(engine, [s], params)[0] for s in seqs[:2]]
    batch8 = _capture_batch(engine, seqs, params)
    _workers(engine, "ror_configure", {})
    out["batch1_max_diff"] = max(float(np.abs(lg - reference[i]).max()) for i, (lg, *_) in enumerate(batch1))
    out["batch8_max_diff"] = max(float(np.abs(lg - reference[i]).max()) for i, (lg, *_) in enumerate(batch8))
    out["first_row_max_diff"] = max(float(np.abs(lg[0] - reference[i][0]).max()) for i, (lg, *_) in enumerate(batch8))
    # batching itself: each request's rows at batch 8 equal its rows alone (vLLM against vLLM)
    out["batch8_vs_batch1_max_diff"] = max(float(np.abs(batch8[i][0] - lg).max()) for i, (lg, *_) in enumerate(batch1))
    out["batch8_rows"] = [int(lg.shape[0]) for lg, *_ in batch8]
    # kept for comparisons across runs (tensor parallel against one process)
    np.savez(workdir / f"{family}-{mode}-tp{tp_size}-batch8.npz", *[lg for lg, *_ in batch8])
    out["lengths"] = [len(s) for s in seqs]
    # selections: vLLM's chosen set equals the HF top-k set wherever the k-th and (k+1)-th logits are apart
    agree = total = 0
    for i, (_lg, sel, _res) in enumerate(batch8):
        k = sel.shape[-1]
        srt = np.sort(reference[i], axis=-1)
        clear = (srt[..., -k] - srt[..., -k - 1]) > 1e-3
        same = (np.sort(sel, axis=-1) == np.sort(ref_selected[i], axis=-1)).all(axis=-1)
        agree += int((same | ~clear).sum())
        total += int(same.size)
    out["selection_agree"], out["selection_total"] = agree, total

    # steering invariants: generation with records of every selection
    layer = out["layers"][0]
    k, e = out["top_k"], out["n_experts"]
    # grouped routers: a suppressed expert in the activated expert's group and one in another group
    suppressed = [0, e - 2] if grouped else list(range(k))
    edit = RoutingEdit.from_sets({layer: [e - 1]}, {layer: suppressed})
    edit.validate(engine.sites)
    gen_prompts = seqs[:4]
    plain = generate_vllm(engine, gen_prompts, max_new_tokens=12, record=True)
    empty = generate_vllm(engine, gen_prompts, max_new_tokens=12, edit=RoutingEdit(), record=True)
    steered = generate_vllm(engine, gen_prompts, max_new_tokens=12, edit=edit, record=True)
    out["empty_identical"] = all(a["token_ids"] == b["token_ids"] for a, b in zip(plain, empty))
    out["empty_selections_identical"] = all(np.array_equal(a["selected"], b["selected"]) for a, b in zip(plain, empty))
    j = out["layers"].index(layer)
    sel = np.concatenate([r["selected"][:, j] for r in steered])
    out["activated_always"] = bool((sel == e - 1).any(axis=-1).all())
    out["suppressed_never"] = bool(~np.isin(sel, suppressed).any())
    out["plain_selects_suppressed"] = bool(np.isin(np.concatenate([r["selected"][:, j] for r in plain]), suppressed).any())
    if grouped:
        # the steered selection at the first MoE layer (its logits depend on the tokens only) is the DeepSeek-V3 rule
        # with the edit, from an independent float64 implementation (tests/test_steer_sigmoid.py), on every row
        from tests.test_steer_sigmoid import reference_route

        agree = total = 0
        for r in steered:
            want = reference_route(r["logits"][:, j], bias0, activate=[e - 1], suppress=suppressed, eps=edit.eps, **rule)
            agree += sum(set(w) == set(g.tolist()) for w, g in zip(want, r["selected"][:, j]))
            total += len(want)
        out["steered_reference_agree"], out["steered_reference_total"] = agree, total
        # the plain selection is the family's rule too (bias and groups), on every row
        agree = total = 0
        for r in plain:
            want = reference_route(r["logits"][:, j], bias0, **rule)
            agree += sum(set(w) == set(g.tolist()) for w, g in zip(want, r["selected"][:, j]))
            total += len(want)
        out["plain_reference_agree"], out["plain_reference_total"] = agree, total
    others = [i for i in range(len(out["layers"])) if i != j]
    # the edited layer's raw logits over the prompt are those of the unedited run, bit for bit (the edit
    # changes only the routing computed from them; later layers see other hidden states)
    out["edited_layer_raw_logits_equal"] = all(np.array_equal(a["logits"][: len(p), j], b["logits"][: len(p), j])
                                               for a, b, p in zip(plain, steered, gen_prompts))
    out["other_layers"] = len(others)
    out["steered_changed_tokens"] = any(a["token_ids"] != b["token_ids"] for a, b in zip(plain, steered))
    # after_first_answer: no generated text matches the pattern on random weights -> no row is edited
    late = generate_vllm(engine, gen_prompts, max_new_tokens=12, edit=edit, schedule="after_first_answer", record=True)
    out["after_first_answer_untouched"] = all(a["token_ids"] == b["token_ids"] and np.array_equal(a["selected"], b["selected"])
                                              for a, b in zip(plain, late))

    # the library capture: same files as the HF engine (index, meta, arrays), self-checks E910-E913 on
    from ror_annotate.steer.capture import Capture, capture_router_logits
    from ror_annotate.steer.vllm_engine import capture_router_logits_vllm
    from tests.test_steer_capture import make_tokens

    dd = make_tokens({"train": [9, 30, 17, 5, 22], "test": [12, 8]}, vocab=300)
    vdir, hdir = workdir / f"{family}-{mode}-tp{tp_size}-cap-vllm", workdir / f"{family}-{mode}-tp{tp_size}-cap-hf"
    from ror_annotate.errors import CaptureCheckError

    hf = load_model(str(ckpt), dtype="float32")
    residual = [0, 1] if family in RESIDUAL else None
    capture_router_logits(hf, dd, hdir, model_name="tiny", logits_dtype="float32", overwrite=True, residual_layers=residual)
    try:  # the self-checks on: E913 compares the first trace's first rows with transformers; writes in a thread
        report = capture_router_logits_vllm(engine, dd, vdir, model_name="tiny", logits_dtype="float32", overwrite=True,
                                            batch_size=4, residual_layers=residual, background_writer=True)
        out["capture_error"] = None
    except CaptureCheckError as exc:
        out["capture_error"], out["capture_error_message"] = exc.code, str(exc)
        out["capture_written"] = vdir.exists() and any(vdir.iterdir())
        report = None
    if report is not None:
        v, h = Capture(vdir), Capture(hdir)
        out["capture_captured"] = report.captured
        out["capture_index_equal"] = sorted((r["trace_id"], r["split"], r["n_tokens"]) for r in v.index) == \
            sorted((r["trace_id"], r["split"], r["n_tokens"]) for r in h.index)
        out["capture_meta_diff"] = v.meta.compatible(h.meta)
        out["capture_max_diff"] = max(float(np.abs(v.trace(t)[0] - h.trace(t)[0]).max()) for t in (r["trace_id"] for r in h.index))
        out["capture_selected_bytes_equal"] = (vdir / "selected.bin").stat().st_size == (hdir / "selected.bin").stat().st_size
        if residual:
            # the residual stream after each layer, same file and layout as the HF engine's (float16 on disk)
            out["residual_files"] = [(vdir / "residual.bin").stat().st_size, (hdir / "residual.bin").stat().st_size]
            out["residual_meta"] = [v.meta.residual_layers, v.meta.hidden_size, v.meta.version]
            diffs, scale = [], 0.0
            for row in h.index:
                vr = v.residual[v._by_id[row["trace_id"]]["start"]:][: row["n_tokens"]].astype(np.float32)
                hr = h.residual[row["start"]: row["start"] + row["n_tokens"]].astype(np.float32)
                diffs.append(float(np.abs(vr - hr).max()))
                scale = max(scale, float(np.abs(hr).max()))
            out["residual_max_diff"], out["residual_scale"] = max(diffs), scale
            # what a wrong hook point would be off by: layer 1's output against layer 0's (one layer's whole update)
            out["residual_layer_step"] = float(np.abs(h.residual[:, 1].astype(np.float32) - h.residual[:, 0].astype(np.float32)).max())
    # after_first_answer with a pattern any text matches: prompt rows untouched, later rows edited
    fires = generate_vllm(engine, gen_prompts, max_new_tokens=12, edit=edit, schedule="after_first_answer",
                          record=True, pattern=r"\S")
    prompt_same = later_edited = True
    for a, b, p in zip(plain, fires, gen_prompts):
        n = len(p)
        prompt_same &= bool(np.array_equal(a["selected"][:n], b["selected"][:n]))
        later = b["selected"][n + 4:, j]  # a few tokens in, the generated text holds a non-space character
        later_edited &= bool((later == e - 1).any(axis=-1).all() and not np.isin(later, list(range(k))).any())
    out["after_first_answer_prompt_untouched"] = prompt_same
    out["after_first_answer_edits_later_rows"] = later_edited
    # the method's protocol on vLLM: all four conditions (the random control drawn against the engine's sites,
    # honouring a grouped router's groups)
    from ror_annotate.steer.evaluate import Problem
    from ror_annotate.steer.vllm_engine import run_evaluation_vllm

    rows = run_evaluation_vllm(engine, [Problem("p1", "1+1?", "2"), Problem("p2", "2+3?", "5")], edit, max_new_tokens=6)
    out["evaluation_rows"] = [(r["condition"], r["problem_id"], r["generated_tokens"] > 0) for r in rows]
    print("RESULT " + json.dumps(out), flush=True)
    if tp_size > 1:  # the ranks' worker processes exit with the engine (os._exit below would orphan them)
        engine.close()


if __name__ == "__main__":
    main()
    # the in-process engine's teardown can hang after a compiled run (seen on the CPU build): the result is out
    sys.stdout.flush()
    os._exit(0)
