"""Router families: discovery, the no-edit equivalence that validates each family's rules, refusals,
and the "hook fired" check. Tiny random-weight models from tests/moe_fixtures.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from . import moe_fixtures as mf  # noqa: E402

from ror_annotate.errors import SteerError  # noqa: E402
from ror_annotate.steer.families import find_router_sites, log_probs, route, selection_scores  # noqa: E402
from ror_annotate.steer.hooks import RouterHooks  # noqa: E402
from ror_annotate.steer.steering import RoutingEdit, steer_routing  # noqa: E402

pytestmark = pytest.mark.steer

# name -> (family, n_experts, top_k, renormalize, has shared expert, path prefix of the routers)
EXPECTED = {
    "qwen3_moe": ("qwen3_moe", 8, 2, True, False, "model.layers."),
    "qwen3_moe_no_renorm": ("qwen3_moe", 8, 2, False, False, "model.layers."),
    "qwen2_moe": ("qwen2_moe", 8, 2, False, True, "model.layers."),
    "mixtral": ("mixtral", 4, 2, True, False, "model.layers."),
    "olmoe": ("olmoe", 8, 2, False, False, "model.layers."),
    "gpt_oss": ("gpt_oss", 4, 2, True, False, "model.layers."),
    "qwen3_5_moe": ("qwen3_5_moe", 8, 2, True, True, "model.layers."),
    "qwen3_next": ("qwen3_next", 8, 2, True, True, "model.layers."),
    "gemma4": ("gemma4", 8, 2, True, False, "model.layers."),
    "qwen3_5_moe_vl": ("qwen3_5_moe", 8, 2, True, True, "model.language_model.layers."),
    "gemma4_vl": ("gemma4", 8, 2, True, False, "model.language_model.layers."),
    "deepseek_v3": ("deepseek_v3", 16, 3, True, True, "model.layers."),
    "glm4_moe": ("glm4_moe", 8, 2, False, True, "model.layers."),
}


@pytest.fixture(scope="module", params=sorted(mf.BUILDERS))
def tiny(request):
    return request.param, mf.build(request.param)


def _ids(seed: int = 0, shape=(2, 9)):
    return torch.randint(3, mf.VOCAB - 10, shape, generator=torch.Generator().manual_seed(seed))


def test_every_builder_has_an_expectation():
    assert set(EXPECTED) == set(mf.BUILDERS)


def test_discovery(tiny):
    name, model = tiny
    family, n_experts, top_k, renorm, shared, prefix = EXPECTED[name]
    sites = find_router_sites(model)
    assert [s.layer for s in sites] == [0, 1]
    assert [s.position for s in sites] == [0, 1]
    for site in sites:
        assert site.family.name == family
        assert (site.n_experts, site.top_k, site.renormalize) == (n_experts, top_k, renorm)
        assert site.name.startswith(prefix)
        assert bool(site.shared_experts) == shared
        modules = dict(model.named_modules())
        assert all(path in modules for path in site.shared_experts)


def test_no_edit_recomputation_equals_router_output(tiny):
    """With nothing edited, the family's rules must reproduce the router's own (weights, indices)."""
    _, model = tiny
    own: dict[int, tuple] = {}

    def keep(site, logits, output):
        own[site.position] = (output[1].detach().clone(), output[2].detach().clone(), logits.detach().clone())

    ids = _ids()
    with torch.no_grad():
        with RouterHooks(model, keep):
            reference = model(input_ids=ids).logits
        with steer_routing(model, record=True) as handle:
            recomputed = model(input_ids=ids).logits
    sites = handle.sites
    assert len(own) == len(sites)
    for site in sites:
        weights, indices, logits = own[site.position]
        new_w, new_i = route(site, selection_scores(site, logits))
        assert torch.equal(new_i, indices)
        torch.testing.assert_close(new_w.to(weights.dtype), weights, rtol=1e-5, atol=1e-6)
        assert torch.equal(handle.selections[0][site.position].reshape(-1, site.top_k), indices)
    torch.testing.assert_close(recomputed, reference, rtol=1e-5, atol=1e-5)


def test_wrong_renormalisation_rule_is_caught():
    """The equivalence above is sensitive: flipping a family's renorm flag changes the weights."""
    model = mf.build("qwen3_moe_no_renorm")
    own = {}

    def keep(site, logits, output):
        own[site.position] = (output[1].clone(), logits.clone())

    with torch.no_grad(), RouterHooks(model, keep):
        model(input_ids=_ids())
    site = find_router_sites(model)[0]
    site.renormalize = True
    weights, logits = own[0]
    new_w, _ = route(site, log_probs(logits))
    assert not torch.allclose(new_w, weights, atol=1e-3)


def test_gemma4_logits_come_from_proj_not_probabilities():
    model = mf.build("gemma4")
    seen = {}

    def keep(site, logits, output):
        seen[site.position] = (logits.detach().clone(), output[0].detach().clone())

    with torch.no_grad(), RouterHooks(model, keep):
        model(input_ids=_ids())
    logits, probs = seen[0]
    # item 0 of Gemma 4's router output is softmax(proj(x)); the hook must see proj(x) itself
    torch.testing.assert_close(torch.softmax(logits.float(), -1), probs.float(), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(logits.float().sum(-1), torch.ones(logits.shape[0]))


def test_hook_not_firing_is_an_error(monkeypatch):
    """A sparse block that computes routing without calling its router module must raise, not no-op."""
    model = mf.build("qwen3_moe")
    block = model.model.layers[1].mlp
    gate = block.gate

    def bypass(hidden_states):
        b, s, h = hidden_states.shape
        flat = hidden_states.view(-1, h)
        logits = torch.nn.functional.linear(flat, gate.weight)
        w, idx = torch.topk(torch.softmax(logits, -1), gate.top_k, dim=-1)
        return block.experts(flat, idx, w / w.sum(-1, keepdim=True)).reshape(b, s, h)

    monkeypatch.setattr(block, "forward", bypass)
    edit = RoutingEdit.from_sets({}, {0: [0], 1: [0]})
    with pytest.raises(SteerError, match=r"did not fire on 1 of 2 MoE layers.*layer 1"):
        with torch.no_grad(), steer_routing(model, edit):
            model(input_ids=_ids())
    # an edit that leaves the bypassed layer alone hooks only layer 0, which fires
    with torch.no_grad(), steer_routing(model, RoutingEdit.from_sets({}, {0: [0]})) as handle:
        model(input_ids=_ids())
    assert handle.hooks.fired == {0: 1}


def test_mxfp4_bypass_parent_is_refused():
    model = mf.build("gpt_oss")
    Mxfp4GptOssMLP = type("Mxfp4GptOssMLP", (torch.nn.Module,), {})
    wrapper = Mxfp4GptOssMLP()
    wrapper.router = model.model.layers[0].mlp.router
    model.model.layers[0].mlp = wrapper
    with pytest.raises(SteerError, match="MXFP4.*without calling the router"):
        find_router_sites(model)


def test_unregistered_sigmoid_router_is_refused():
    """A router carrying a correction bias that is not a registered family (its rule may differ) is refused."""
    class Dots1TopkRouter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(4, 8))
            self.register_buffer("e_score_correction_bias", torch.zeros(4))

    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList([torch.nn.Module()])
    model.layers[0].mlp = torch.nn.Module()
    model.layers[0].mlp.gate = Dots1TopkRouter()
    with pytest.raises(SteerError, match="sigmoid/grouped top-k.*e_score_correction_bias.*deepseek_v3, glm4_moe"):
        find_router_sites(model)


def test_dense_model_has_no_router():
    from transformers import LlamaConfig, LlamaForCausalLM

    dense = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=16, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))
    with pytest.raises(SteerError, match="no MoE router of a supported family.*qwen3_moe"):
        find_router_sites(dense)


def test_register_family_rejects_duplicates():
    from ror_annotate.errors import ConfigError
    from ror_annotate.steer.families import FamilySpec, register_family

    with pytest.raises(ConfigError, match="already"):
        register_family(FamilySpec("mixtral", ("SomethingElse",)))
    with pytest.raises(ConfigError, match="already belong"):
        register_family(FamilySpec("new_family", ("MixtralTopKRouter",)))
