"""Sigmoid, grouped top-k routers (DeepSeek-V3/R1, GLM-4-MoE): routing identical to the transformers
router modules, the steering edit against an independent numpy implementation of the DeepSeek-V3
rule, edits the groups cannot honour refused (E950-E954), and the capture self-check (E912) using
the family's grouped rule. Tiny random-weight models from tests/moe_fixtures.py."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from ror_annotate.errors import CaptureCheckError, SteerError  # noqa: E402
from ror_annotate.steer.capture import forward_router_logits  # noqa: E402
from ror_annotate.steer.checks import GroupedSelection, check_batch  # noqa: E402
from ror_annotate.steer.families import find_router_sites, route  # noqa: E402
from ror_annotate.steer.hooks import RouterHooks  # noqa: E402
from ror_annotate.steer.steering import LayerEdit, RoutingEdit, edited_routing, steer_routing  # noqa: E402

from . import moe_fixtures as mf  # noqa: E402

pytestmark = pytest.mark.steer

GROUPED = ["deepseek_v3", "glm4_moe"]


def reference_route(logits, bias, *, n_group, topk_group, top_k, renorm, scaling, activate=(), suppress=(), eps=1e-2):
    """The DeepSeek-V3 routing rule with the steering edit, per token, in float64 (written from the spec).

    DeepSeek-V3 (technical report, Sec. 2.1.2; transformers ``DeepseekV3TopkRouter``): s = sigmoid(logit);
    selection on s + bias, restricted to the topk_group groups whose two best biased scores sum highest;
    weights = s of the selected, / their sum if renormalised, * routed_scaling_factor. Edit: activated
    logits -> max + eps, suppressed -> min - eps (of the unedited row); suppressed experts are never
    selected nor counted in their group's score (a group scores its best two remaining, or its one
    remaining expert, -inf if none); an activated expert's group is kept and the expert selected.

    Returns a list, per token, of dicts expert -> weight.
    """
    x = np.asarray(logits, dtype=np.float64)
    bias = np.asarray(bias, dtype=np.float64)
    n_experts = x.shape[1]
    size = n_experts // n_group
    act, sup = set(activate), set(suppress)
    out = []
    for row in x:
        edited = row.copy()
        for e in sup:
            edited[e] = row.min() - eps
        for e in act:
            edited[e] = row.max() + eps
        s = 1.0 / (1.0 + np.exp(-edited))
        c = s + bias
        group_score = []
        for g in range(n_group):
            members = [e for e in range(g * size, (g + 1) * size) if e not in sup]
            if any(e in act for e in members):
                group_score.append(np.inf)
            elif members:
                group_score.append(sum(sorted((c[e] for e in members), reverse=True)[:2]))
            else:
                group_score.append(-np.inf)
        kept = sorted(range(n_group), key=lambda g: -group_score[g])[:topk_group]
        candidates = [e for g in kept for e in range(g * size, (g + 1) * size) if e not in sup]
        chosen = sorted(candidates, key=lambda e: (e not in act, -c[e]))[:top_k]
        w = np.array([s[e] for e in chosen])
        if renorm:
            w = w / w.sum()
        out.append(dict(zip(chosen, w * scaling)))
    return out


def _as_dicts(weights, indices):
    return [dict(zip(i.tolist(), w.tolist())) for w, i in zip(weights, indices)]


def _assert_same_routing(got, expected, atol=1e-6):
    assert len(got) == len(expected)
    for t, (g, e) in enumerate(zip(got, expected)):
        assert set(g) == set(e), f"token {t}: selected {sorted(g)}, reference {sorted(e)}"
        for expert in e:
            assert abs(g[expert] - e[expert]) <= atol, f"token {t} expert {expert}: {g[expert]} vs {e[expert]}"


def _site_rule(site):
    return dict(n_group=site.n_group, topk_group=site.topk_group, top_k=site.top_k, renorm=site.renormalize,
                scaling=site.scaling)


@pytest.fixture(scope="module", params=GROUPED)
def grouped(request):
    model = mf.build(request.param)
    hidden = torch.randn(96, model.config.hidden_size, generator=torch.Generator().manual_seed(5))
    return request.param, model, find_router_sites(model), hidden


def test_sites_read_the_groups_bias_and_scaling(grouped):
    name, model, sites, _ = grouped
    cfg = model.config
    for site in sites:
        assert (site.n_group, site.topk_group, site.scaling) == (cfg.n_group, cfg.topk_group, cfg.routed_scaling_factor)
        assert site.renormalize == cfg.norm_topk_prob
        assert site.bias is site.module.e_score_correction_bias
        assert site.shared_experts == (site.name.rsplit(".", 1)[0] + ".shared_experts",)


def test_route_is_identical_to_the_transformers_router(grouped):
    """Same indices and weights, bit for bit, as the router module itself; and the reference agrees."""
    _, _, sites, hidden = grouped
    for site in sites:
        with torch.no_grad():
            logits, weights, indices = site.module(hidden)
            new_w, new_i = route(site, logits.float())
        assert torch.equal(new_i, indices)
        assert torch.equal(new_w, weights)
        ref = reference_route(logits.numpy(), site.bias.numpy(), **_site_rule(site))
        _assert_same_routing(_as_dicts(weights, indices), ref)


def test_the_bias_and_the_groups_change_the_selection(grouped):
    """The fixtures exercise the rule: ignoring the bias or the groups would select differently."""
    _, _, sites, hidden = grouped
    site = sites[0]
    with torch.no_grad():
        logits, _, indices = site.module(hidden)
    chosen = torch.sort(indices, -1).values
    plain = torch.sort(torch.topk(logits.sigmoid(), site.top_k, -1).indices, -1).values
    no_bias = reference_route(logits.numpy(), np.zeros(site.n_experts), **_site_rule(site))
    biased_ungrouped = torch.sort(torch.topk(logits.sigmoid() + site.bias, site.top_k, -1).indices, -1).values
    assert (chosen != plain).any(dim=-1).sum() > 5
    assert (chosen != biased_ungrouped).any(dim=-1).sum() > 5
    assert sum(set(r) != set(i.tolist()) for r, i in zip(no_bias, indices)) > 5
    # the scaling factor is applied: renormalised weights sum to it, others are sigmoid scores times it
    w, i = route(site, logits.float())
    if site.renormalize:
        torch.testing.assert_close(w.sum(-1), torch.full((len(w),), site.scaling))
    else:
        torch.testing.assert_close(w, logits.sigmoid().gather(1, i) * site.scaling)


# edits per family: (activate, suppress) on layer 0, chosen against the group layout
EDITS = {
    "deepseek_v3": [  # 16 experts, groups of 4, topk_group 2, top-3
        ((5,), ()),
        ((), (0, 1, 2, 3)),  # a whole group suppressed
        ((), (1, 2, 3)),  # group 0 keeps one expert: scored by it alone
        ((0, 9), ()),  # activated experts in two groups: both groups kept
        ((12,), (13, 14, 15, 4)),  # activated expert's group keeps only it
        ((2, 3, 6), (0, 1, 7, 8, 9)),
    ],
    "glm4_moe": [  # 8 experts, groups of 4, topk_group 1, top-2
        ((6,), ()),
        ((), (0, 1)),  # group 0 scored by its two remaining experts
        ((1,), (4, 5, 6)),
        ((0, 2), (1, 3)),
    ],
}


def test_steered_routing_equals_the_reference(grouped):
    name, model, sites, hidden = grouped
    site = sites[0]
    with torch.no_grad():
        output = site.module(hidden)
    for activate, suppress in EDITS[name]:
        edit = RoutingEdit.from_sets({site.layer: activate}, {site.layer: suppress})
        edit.validate(sites)
        layer = LayerEdit.prepare(site, edit, "cpu")
        _, weights, indices = edited_routing(layer, output[0], output)
        got = _as_dicts(weights, indices)
        ref = reference_route(output[0].numpy(), site.bias.numpy(), activate=activate, suppress=suppress,
                              eps=edit.eps, **_site_rule(site))
        _assert_same_routing(got, ref)
        for row in got:  # the invariants, stated directly
            assert set(activate) <= set(row) and not set(suppress) & set(row)
        # the edit changes routing for most tokens (the comparison above is not vacuous)
        assert sum(set(g) != set(i.tolist()) for g, i in zip(got, output[2])) > 0


def test_steering_generate_keeps_activated_groups_and_drops_suppressed_experts():
    model = mf.build("deepseek_v3")
    ids = torch.randint(3, mf.VOCAB - 10, (2, 7), generator=torch.Generator().manual_seed(2))
    edit = RoutingEdit.from_sets({0: [1, 14], 1: [7]}, {0: [0, 2, 3], 1: [4, 5, 6, 8]})
    dispatched = []
    modules = dict(model.named_modules())
    handles = [modules[f"model.layers.{i}.mlp.experts"].register_forward_pre_hook(
        lambda _m, args, layer=i: dispatched.append((layer, args[1].clone()))) for i in (0, 1)]
    try:
        with torch.no_grad(), steer_routing(model, edit):
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, min_new_tokens=4,
                           do_sample=False, pad_token_id=0)
    finally:
        for h in handles:
            h.remove()
    assert len(dispatched) == 8
    for layer, idx in dispatched:
        for expert in edit.activate[layer]:
            assert (idx == expert).any(-1).all()
        assert not torch.isin(idx, torch.tensor(edit.suppress[layer])).any()


@pytest.mark.parametrize("name,activate,suppress,code", [
    ("deepseek_v3", (0, 4, 8), (), "E952"),  # three groups activated, two kept
    ("deepseek_v3", (), tuple(range(12)), "E953"),  # one group left, two kept
    ("deepseek_v3", (), (1, 2, 3, 5, 6, 7), "E954"),  # two groups of one expert may be kept: 2 < top-3
    ("glm4_moe", (0,), (1, 2, 3), "E954"),  # the activated group keeps one expert, top-2
    ("glm4_moe", (0, 4), (), "E952"),
])
def test_edits_the_groups_cannot_honour_are_refused(name, activate, suppress, code):
    model = mf.build(name)
    edit = RoutingEdit.from_sets({0: activate}, {0: suppress})
    with pytest.raises(SteerError) as info:
        with steer_routing(model, edit):
            pytest.fail("the edit must be refused before any forward")
    assert info.value.code == code


def test_inconsistent_groups_are_refused():
    model = mf.build("deepseek_v3")
    model.model.layers[1].mlp.gate.num_group = 3  # 16 experts do not split into 3 groups
    with pytest.raises(SteerError) as info:
        find_router_sites(model)
    assert info.value.code == "E950" and "n_group=3" in str(info.value)


def test_capture_stores_pre_sigmoid_logits_and_checks_the_grouped_rule(grouped):
    name, model, sites, _ = grouped
    seqs = [list(range(5, 25)), list(range(40, 52))]
    inputs = {}

    def keep_input(position):
        def hook(_module, args, _output):
            inputs.setdefault(position, args[0].clone())
        return hook

    handles = [s.module.register_forward_hook(keep_input(s.position)) for s in sites]
    try:
        ((logits, selected),) = forward_router_logits(model, [seqs[0]])
    finally:
        for h in handles:
            h.remove()
    for site in sites:  # raw router logits: hidden @ W^T, no sigmoid, no bias
        hidden = inputs[site.position].reshape(-1, site.module.weight.shape[1]).float()
        with torch.no_grad():
            expected = hidden @ site.module.weight.detach().float().T
        torch.testing.assert_close(logits[:, site.position], expected, rtol=0, atol=1e-5)
    assert (logits < 0).any() and (logits > 1).any()
    rule = GroupedSelection.from_sites(sites)
    kw = dict(family=name, layers=[s.layer for s in sites], top_k=sites[0].top_k, model_dtype="float32",
              storage_dtype="float32")
    batch = forward_router_logits(model, seqs)
    lg = np.concatenate([b[0].numpy() for b in batch])
    sel = np.concatenate([b[1].numpy() for b in batch])
    check_batch(lg, sel, grouped=rule, **kw)  # the router's own selections pass
    # the softmax families' rule (top-k of the logits) is not weakened: it rejects these selections
    with pytest.raises(CaptureCheckError) as info:
        check_batch(lg, sel, **kw)
    assert info.value.code == "E912"
    # and the grouped rule rejects the plain top-k of the logits, or a selection that ignores the bias
    plain = np.argsort(-lg, axis=-1, kind="stable")[..., : sites[0].top_k]
    with pytest.raises(CaptureCheckError, match="top-k") as info:
        check_batch(lg, plain, grouped=rule, **kw)
    assert info.value.code == "E912"
    unbiased = GroupedSelection(np.zeros_like(rule.bias), rule.n_group, rule.topk_group)
    with pytest.raises(CaptureCheckError) as info:
        check_batch(lg, sel, grouped=unbiased, **kw)
    assert info.value.code == "E912"


def test_softmax_families_have_no_grouped_rule():
    assert GroupedSelection.from_sites(find_router_sites(mf.build("qwen3_moe"))) is None


def test_record_hooks_see_the_raw_logits():
    model = mf.build("glm4_moe")
    got = []
    with torch.no_grad(), RouterHooks(model, lambda site, logits, output: got.append(logits is output[0])):
        model(input_ids=torch.tensor([[5, 6, 7]]))
    assert got == [True, True]


def test_a_group_with_one_remaining_expert_is_scored_by_it():
    """Suppressing three of a group's four experts leaves the group scored by its one remaining expert (not
    -inf): a strong remaining expert still brings its group into the selection."""
    model = mf.build("deepseek_v3")
    site = find_router_sites(model)[0]
    logits = torch.full((4, site.n_experts), -10.0)
    logits[:, 0] = 10.0  # sigmoid ~ 1 against ~ 0 elsewhere: group 0 outscores any pair of weak experts
    logits[1:, 8] = torch.tensor([9.0, 0.0, -9.0])
    edit = RoutingEdit.from_sets({}, {site.layer: (1, 2, 3)})
    edit.validate([site])
    output = site.module.forward(torch.zeros(4, model.config.hidden_size))  # dtypes of the router's output
    _, weights, indices = edited_routing(LayerEdit.prepare(site, edit, "cpu"), logits, output)
    ref = reference_route(logits.numpy(), site.bias.detach().numpy(), suppress=(1, 2, 3), **_site_rule(site))
    assert all(0 in row for row in ref)
    _assert_same_routing(_as_dicts(weights, indices), ref)


def test_random_control_sets_respect_the_groups():
    """The random control of equal size is redrawn until a grouped router can honour it (seeded)."""
    from ror_annotate.steer.steering import random_expert_sets

    sites = find_router_sites(mf.build("deepseek_v3"))
    edit = RoutingEdit.from_sets({0: [0, 1, 4]}, {0: [5, 6, 8, 9, 10]})
    draws = [random_expert_sets(edit, sites, seed=seed) for seed in range(40)]
    assert draws[3] == random_expert_sets(edit, sites, seed=3)
    for control in draws:
        assert (len(control.activate[0]), len(control.suppress[0])) == (3, 5)
        control.validate(sites)
    # unconstrained draws of these sizes would often be refused: the redraw does real work
    import random

    rng, refused = random.Random(0), 0
    for _ in range(200):
        drawn = rng.sample(range(16), 8)
        try:
            RoutingEdit.from_sets({0: drawn[:3]}, {0: drawn[3:]}).validate(sites)
        except SteerError:
            refused += 1
    assert refused > 50


def _vllm_router(**attrs):
    """A stand-in for a vLLM 0.32 router (``CPURouter`` / ``GroupedTopKRouter`` attributes)."""
    from types import SimpleNamespace

    base = dict(scoring_func="softmax", e_score_correction_bias=None, use_grouped_topk=False, num_expert_group=None,
                topk_group=None, global_num_experts=16, top_k=3, renormalize=True, routed_scaling_factor=1.0)
    return SimpleNamespace(**{**base, **attrs})


def test_the_vllm_engine_reads_each_routers_rule():
    """Softmax top-k: no rule; sigmoid + bias: the grouped rule with the router's own groups, renormalisation and
    scaling (one group where vLLM falls back to ungrouped biased top-k); anything else is refused (E955)."""
    from ror_annotate.steer.vllm_engine import router_rule

    bias = torch.zeros(16)
    assert router_rule(_vllm_router()) is None
    rule = router_rule(_vllm_router(scoring_func="sigmoid", e_score_correction_bias=bias, use_grouped_topk=True,
                                     num_expert_group=4, topk_group=2, renormalize=False, routed_scaling_factor=2.5))
    assert (rule.n_experts, rule.top_k, rule.n_group, rule.topk_group, rule.group_size) == (16, 3, 4, 2, 4)
    assert (rule.renormalize, rule.scaling) == (False, 2.5) and rule.bias is bias
    # GroupedTopKRouter (no use_grouped_topk attribute) with groups that do not divide the experts: ungrouped
    fallback = _vllm_router(scoring_func="sigmoid", e_score_correction_bias=bias, num_expert_group=5, topk_group=2)
    del fallback.use_grouped_topk
    assert (router_rule(fallback).n_group, router_rule(fallback).topk_group) == (1, 1)
    for refused in (_vllm_router(use_grouped_topk=True, num_expert_group=4, topk_group=2),  # DeepSeek-V2: softmax, groups
                    _vllm_router(scoring_func="sigmoid"),  # sigmoid without a correction bias
                    _vllm_router(scoring_func="sqrtsoftplus", e_score_correction_bias=bias)):  # DeepSeek-V4
        with pytest.raises(SteerError) as info:
            router_rule(refused)
        assert info.value.code == "E955"


def test_the_vllm_engine_refuses_a_family_whose_rule_vllm_does_not_use():
    from ror_annotate.steer.families import FAMILIES
    from ror_annotate.steer.vllm_engine import _family_name, check_family_rule, router_rule

    grouped = router_rule(_vllm_router(scoring_func="sigmoid", e_score_correction_bias=torch.zeros(16)))
    check_family_rule(FAMILIES.get("glm4_moe"), "glm4_moe", {0: grouped, 1: grouped})
    check_family_rule(FAMILIES.get("qwen3_moe"), "qwen3_moe", {0: None})
    check_family_rule(None, "some_softmax_moe", {0: None})
    for family, model_type, rules in ((FAMILIES.get("qwen3_moe"), "qwen3_moe", {0: grouped}),
                                      (None, "unregistered_sigmoid_moe", {0: grouped}),
                                      (FAMILIES.get("deepseek_v3"), "deepseek_v3", {0: grouped, 1: None})):
        with pytest.raises(SteerError) as info:
            check_family_rule(family, model_type, rules)
        assert info.value.code == "E955"
    assert _family_name("glm4_moe") == "glm4_moe" and _family_name("qwen3_moe") == "qwen3_moe"


@pytest.mark.parametrize("renorm", [True, False])
def test_the_vllm_grouped_op_is_the_reference_rule_with_the_edit(renorm):
    """The body of the vLLM engine's ``route_grouped`` op: on steered rows, the DeepSeek-V3 rule with the edit
    (independent float64 implementation above), with the router's bias, groups, renormalisation and scaling;
    rows not steered and layers without an edit get vLLM's weights and ids back bit for bit."""
    from ror_annotate.steer.vllm_engine import GROUPED_RULES, STATE, GroupedRule, _Step

    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(40, 16, generator=gen) * 2
    bias = torch.randn(16, generator=gen) * 0.3
    rule = GroupedRule(_vllm_router(e_score_correction_bias=bias), 16, 3, 4, 2, renorm, 2.5)
    act, sup = [6], [0, 7, 13]
    masks = (torch.zeros(16, dtype=torch.bool), torch.zeros(16, dtype=torch.bool))
    masks[0][act], masks[1][sup] = True, True
    vllm_w, vllm_i = torch.rand(40, 3, generator=gen), torch.randint(0, 16, (40, 3), generator=gen, dtype=torch.int32)
    STATE.reset()
    GROUPED_RULES.clear()
    GROUPED_RULES[5] = rule
    STATE.edit_masks = {5: masks}
    STATE.step = _Step(["a", "b"], np.array([0, 0]), np.array([24, 16]), active=torch.tensor([True] * 24 + [False] * 16))
    try:
        edited = STATE.edit(logits, 5)
        w, i = STATE.regroup(edited, vllm_w, vllm_i, 5)
        assert w.dtype == vllm_w.dtype and i.dtype == vllm_i.dtype
        ref = reference_route(logits[:24].numpy(), bias.numpy(), n_group=4, topk_group=2, top_k=3, renorm=renorm,
                              scaling=2.5, activate=act, suppress=sup, eps=STATE.eps)
        _assert_same_routing(_as_dicts(w[:24], i[:24]), ref, atol=1e-5)
        assert torch.equal(w[24:], vllm_w[24:]) and torch.equal(i[24:], vllm_i[24:])
        w2, i2 = STATE.regroup(logits, vllm_w, vllm_i, 4)  # a layer without an edit
        assert torch.equal(w2, vllm_w) and torch.equal(i2, vllm_i)
    finally:
        STATE.reset()
        GROUPED_RULES.clear()
