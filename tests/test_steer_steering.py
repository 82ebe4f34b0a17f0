"""Routing-score steering: the operator, its constraints, generate() with the KV cache on every family,
bf16 models, schedules and the random control."""

from __future__ import annotations

import inspect

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from ror_annotate.errors import SteerError  # noqa: E402
from ror_annotate.steer.families import find_router_sites  # noqa: E402
from ror_annotate.steer.hooks import RouterHooks  # noqa: E402
from ror_annotate.steer.steering import (  # noqa: E402
    AfterFirstAnswer,
    RoutingEdit,
    edit_log_probs,
    random_expert_sets,
    steer_routing,
)

from . import moe_fixtures as mf  # noqa: E402

pytestmark = pytest.mark.steer

FAMILIES = ["qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "gpt_oss", "qwen3_5_moe", "qwen3_next", "gemma4",
            "qwen3_5_moe_vl", "gemma4_vl", "deepseek_v3", "glm4_moe"]


def _prompt(seed=0, n=6):
    return torch.randint(3, mf.VOCAB - 10, (1, n), generator=torch.Generator().manual_seed(seed))


def _usage(model, ids):
    """Per layer position: how often each expert is selected on an unsteered forward."""
    counts = {}

    def count(site, logits, output):
        counts[site.position] = torch.bincount(output[2].reshape(-1), minlength=site.n_experts)

    with torch.no_grad(), RouterHooks(model, count):
        model(input_ids=ids)
    return counts


def _edit_against_usage(model, ids):
    """Suppress each layer's most used experts, activate its least used one: steering must change routing."""
    sites = find_router_sites(model)
    usage = _usage(model, ids)
    activate, suppress = {}, {}
    for site in sites:
        order = torch.argsort(usage[site.position], descending=True, stable=True).tolist()
        n_sup = min(2, site.n_experts - site.top_k)
        suppress[site.layer] = order[:n_sup]
        activate[site.layer] = [order[-1]]
    return RoutingEdit.from_sets(activate, suppress), usage


def test_operator_hand_example():
    logp = torch.log_softmax(torch.tensor([[2.0, 1.0, 0.0, -1.0]]), -1)
    edited = edit_log_probs(logp, [3], [0], eps=0.5)
    # expert 3 -> max + eps, expert 0 -> min + ... min - eps (computed on the unedited row)
    assert edited[0, 3].item() == pytest.approx(logp[0, 0].item() + 0.5)
    assert edited[0, 0].item() == pytest.approx(logp[0, 3].item() - 0.5)
    assert torch.equal(edited[0, 1:3], logp[0, 1:3])
    probs = torch.softmax(edited, -1)
    assert torch.topk(probs, 2).indices.tolist() == [[3, 1]]


def test_operator_refuses_bf16_because_the_edit_rounds_away():
    x = torch.tensor([-6.0], dtype=torch.bfloat16)
    assert (x - 0.01).item() == x.item()  # the pitfall: bf16 spacing is 1/32 in [4, 8)
    with pytest.raises(SteerError, match="float32"):
        edit_log_probs(torch.zeros(1, 4, dtype=torch.bfloat16), [0], [], 0.01)


def test_operator_row_mask():
    logp = torch.log_softmax(torch.randn(3, 5, generator=torch.Generator().manual_seed(1)), -1)
    edited = edit_log_probs(logp, [], [0], 0.1, rows=torch.tensor([True, False, True]))
    assert torch.equal(edited[1], logp[1])
    assert (edited[[0, 2], 0] < logp[[0, 2]].min(-1).values).all()


@pytest.mark.parametrize("edit,match", [
    ({"activate": {0: [0, 1, 2]}}, r"3 experts to activate but only top-2"),
    ({"suppress": {0: [0, 1, 2, 3, 4, 5, 6]}}, r"leaves fewer than top-2"),
    ({"activate": {0: [1]}, "suppress": {0: [1]}}, r"both activated and suppressed"),
    ({"suppress": {5: [1]}}, r"layer 5 has no MoE router"),
    ({"suppress": {0: [8]}}, r"outside 0..7.*shared experts"),
])
def test_constraints(edit, match):
    model = mf.build("qwen2_moe")
    with pytest.raises(SteerError, match=match):
        with steer_routing(model, RoutingEdit.from_sets(edit.get("activate"), edit.get("suppress"))):
            pass


@pytest.mark.parametrize("name", FAMILIES)
def test_generate_with_kv_cache_respects_the_edit_at_every_step(name):
    model = mf.build(name)
    ids = _prompt()
    edit, usage = _edit_against_usage(model, ids)
    sites = find_router_sites(model)
    assert any(usage[s.position][list(edit.suppress[s.layer])].sum() > 0 for s in sites)  # steering has work to do
    # what the experts actually receive (independent of the hook's own record)
    modules = dict(model.named_modules())
    dispatched, shared_calls = [], {path: 0 for s in sites for path in s.shared_experts}
    handles = []
    for site in sites:
        experts = modules[site.name.rsplit(".", 1)[0] + ".experts"]
        handles.append(experts.register_forward_pre_hook(
            lambda _m, args, layer=site.layer: dispatched.append((layer, args[1].detach().clone()))))
        for path in site.shared_experts:
            handles.append(modules[path].register_forward_hook(
                lambda *_a, p=path: shared_calls.__setitem__(p, shared_calls[p] + 1)))
    new_tokens = 5
    try:
        with torch.no_grad(), steer_routing(model, edit, record=True) as handle:
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens, do_sample=False, use_cache=True, pad_token_id=0)
    finally:
        for h in handles:
            h.remove()
    assert out.shape[1] == ids.shape[1] + new_tokens
    # one prefill forward then one single-token forward per further step: the KV cache is in use
    assert handle.hooks.forwards == new_tokens
    seq_lens = [sel[0].shape[1] for sel in handle.selections]
    assert seq_lens == [ids.shape[1]] + [1] * (new_tokens - 1)
    assert len(dispatched) == new_tokens * len(sites)
    for layer, indices in dispatched:
        chosen = indices.reshape(-1, indices.shape[-1])
        for expert in edit.suppress.get(layer, ()):
            assert not (chosen == expert).any(), f"suppressed expert {expert} selected at layer {layer}"
        for expert in edit.activate.get(layer, ()):
            assert (chosen == expert).any(dim=-1).all(), f"activated expert {expert} missed at layer {layer}"
    # shared experts are not routed: they still run at every forward of every layer
    assert all(count == new_tokens for count in shared_calls.values())
    assert bool(shared_calls) == (name in ("qwen2_moe", "qwen3_5_moe", "qwen3_next", "qwen3_5_moe_vl",
                                                  "deepseek_v3", "glm4_moe"))


@pytest.mark.parametrize("name", ["qwen3_moe", "gemma4", "deepseek_v3"])
def test_bf16_model_steering_is_exact(name):
    model = mf.build(name, dtype=torch.bfloat16)
    ids = _prompt(seed=3, n=12)
    edit, _ = _edit_against_usage(model, ids)
    with torch.no_grad(), steer_routing(model, edit, record=True) as handle:
        model(input_ids=ids)
    for site in handle.sites:
        chosen = handle.selections[0][site.position].reshape(-1, site.top_k)
        assert not torch.isin(chosen, torch.tensor(edit.suppress[site.layer])).any()
        assert (chosen == edit.activate[site.layer][0]).any(-1).all()


def test_random_control_is_seeded_and_size_matched():
    model = mf.build("qwen3_moe")
    sites = find_router_sites(model)
    edit = RoutingEdit.from_sets({0: [1]}, {0: [2, 3], 1: [4]})
    a = random_expert_sets(edit, sites, seed=7)
    b = random_expert_sets(edit, sites, seed=7)
    c = random_expert_sets(edit, sites, seed=8)
    assert a == b and a != c
    assert {k: len(v) for k, v in a.activate.items() if v} == {0: 1}
    assert {k: len(v) for k, v in a.suppress.items()} == {0: 2, 1: 1}
    a.validate(sites)


def test_spec_json_round_trip():
    edit = RoutingEdit.from_sets({"3": [5, 1]}, {"0": [2]}, eps=0.02)
    assert RoutingEdit.from_json(edit.to_json()) == edit
    assert edit.activate == {3: (1, 5)}
    with pytest.raises(SteerError, match="unknown keys"):
        RoutingEdit.from_json({"supress": {}})


def test_after_first_answer_schedule_with_cache():
    from .tokenizers_fixtures import byte_level_bpe

    tok = byte_level_bpe()
    model = mf.build("qwen3_moe")
    model.resize_token_embeddings(len(tok))
    sites = find_router_sites(model)
    prompt = torch.tensor([tok("Let me try to solve this step by step.")["input_ids"]])
    answer = tok("So the answer is \\boxed{12}. Wait, is that right? Hmm, let me check again")["input_ids"]
    close = next(i for i in range(len(answer)) if "}" in tok.decode(answer[: i + 1]))
    edit = RoutingEdit.from_sets({}, {s.layer: [0, 1, 2, 3, 4, 5] for s in sites})
    schedule = AfterFirstAnswer(tok, r"\\boxed\{[^{}]*\}")
    with torch.no_grad(), steer_routing(model, edit, schedule=schedule, record=True) as handle:
        out = model(input_ids=prompt, use_cache=True)
        # recent transformers 5.x call it `cache` (`past_key_values` is deprecated there); older ones only know the latter
        key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        cache = getattr(out, key)
        for token in answer:
            out = model(input_ids=torch.tensor([[token]]), **{key: cache}, use_cache=True)
            cache = getattr(out, key)
    active = [bool(sel["active"][0]) for sel in handle.selections]
    # forward i+1 processes answer[i]; the row turns active once answer[:i+1] holds the closed \boxed{}
    assert active[0] is False
    assert active[1:] == [i >= close for i in range(len(answer))]
    for sel in handle.selections:
        for site in sites:
            chosen = sel[site.position]
            if sel["active"][0]:
                assert (chosen >= 6).all()


def test_edit_is_undone_when_the_context_exits():
    model = mf.build("mixtral")
    ids = _prompt()
    with torch.no_grad():
        before = model(input_ids=ids).logits
        with steer_routing(model, RoutingEdit.from_sets({}, {0: [0, 1], 1: [0, 1]})):
            steered = model(input_ids=ids).logits
        after = model(input_ids=ids).logits
    assert not torch.allclose(before, steered)
    assert torch.equal(before, after)
