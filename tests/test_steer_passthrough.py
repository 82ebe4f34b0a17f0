"""Bit-exact pass-through and the cost shape of the steering hook.

- An empty edit, or an edit whose schedule leaves every row inactive, gives greedy tokens and
  logits bit-identical to the model without the context, over 128 generated tokens in bf16, for
  every registered family (tiny random-weight models, CPU).
- Rows the schedule leaves inactive in a partly steered batch keep the router's own routing bit
  for bit.
- Where the edit applies, the recomputation follows the router's own order and dtype: with empty
  masks it reproduces the router's (weights, indices) bit for bit, in bf16 and fp32.
- The hook adds no host synchronisation (``aten._local_scalar_dense``, what ``.item()``,
  ``bool(tensor)`` and ``.tolist()`` dispatch to), no host->device copies and no tensors built
  from Python lists at forward time; counted with a ``TorchDispatchMode``.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from ror_annotate.steer.families import find_router_sites  # noqa: E402
from ror_annotate.steer.hooks import RouterHooks  # noqa: E402
from ror_annotate.steer.steering import LayerEdit, RoutingEdit, edited_routing, steer_routing  # noqa: E402

from . import moe_fixtures as mf  # noqa: E402

pytestmark = pytest.mark.steer

NEW_TOKENS = 128


class _Never:
    """Schedule that never steers a row (like AfterFirstAnswer before any answer)."""

    def observe(self, input_ids):
        pass

    def active_rows(self, batch_size):
        return torch.zeros(batch_size, dtype=torch.bool)


class _Rows:
    """Schedule that steers a fixed set of rows."""

    def __init__(self, rows):
        self.rows = torch.tensor(rows)

    def observe(self, input_ids):
        pass

    def active_rows(self, batch_size):
        return self.rows


def _prompt(seed=0, shape=(1, 6)):
    return torch.randint(3, mf.VOCAB - 10, shape, generator=torch.Generator().manual_seed(seed))


def _suppress_top(model, ids):
    """Suppress, per layer, the experts the unsteered model uses most (so the edit has work to do)."""
    counts = {}

    def count(site, logits, output):
        counts[site.layer] = torch.bincount(output[2].reshape(-1), minlength=site.n_experts)

    with torch.no_grad(), RouterHooks(model, count):
        model(input_ids=ids)
    return RoutingEdit.from_sets({}, {layer: torch.argsort(c, descending=True, stable=True)[:2].tolist()
                                      for layer, c in counts.items()})


def _greedy(model, ids):
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                             min_new_tokens=NEW_TOKENS, do_sample=False, use_cache=True, pad_token_id=0,
                             return_dict_in_generate=True, output_logits=True)
    return out.sequences, torch.stack(out.logits)


@pytest.mark.parametrize("name", sorted(mf.BUILDERS))
def test_empty_edit_and_inactive_schedule_keep_greedy_tokens_bit_identical_bf16(name):
    model = mf.build(name, dtype=torch.bfloat16)
    ids = _prompt()
    tokens, logits = _greedy(model, ids)
    assert tokens.shape[1] == ids.shape[1] + NEW_TOKENS
    with steer_routing(model, RoutingEdit()):
        empty_tokens, empty_logits = _greedy(model, ids)
    edit = _suppress_top(model, ids)
    with steer_routing(model, edit, schedule=_Never()) as handle:
        idle_tokens, idle_logits = _greedy(model, ids)
    assert torch.equal(empty_tokens, tokens) and torch.equal(empty_logits, logits)
    assert torch.equal(idle_tokens, tokens) and torch.equal(idle_logits, logits)
    assert handle.hooks.forwards == NEW_TOKENS and handle.recomputed == 0
    # the same edit, applied, does change the generation (the comparison above can fail)
    with steer_routing(model, edit) as handle:
        steered_tokens, steered_logits = _greedy(model, ids)
    assert handle.recomputed == NEW_TOKENS * len(handle.sites)
    assert not torch.equal(steered_logits, logits)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", sorted(mf.BUILDERS))
def test_recompute_follows_the_routers_own_order_and_dtype(name, dtype):
    """With nothing masked, the edit path returns the router's own (weights, indices) bit for bit."""
    model = mf.build(name, dtype=dtype)
    got = {}

    def recompute(site, logits, output):
        layer = LayerEdit(site, None, None, 0.01)
        got[site.position] = (output, edited_routing(layer, logits, output))

    with torch.no_grad(), RouterHooks(model, recompute):
        model(input_ids=_prompt(shape=(3, 11)))
    assert len(got) == len(find_router_sites(model))
    for own, new in got.values():
        assert new[1].dtype == own[1].dtype and new[2].dtype == own[2].dtype
        assert torch.equal(new[2], own[2])
        assert torch.equal(new[1], own[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", ["qwen3_moe", "qwen2_moe", "gpt_oss", "gemma4", "deepseek_v3"])
def test_inactive_rows_of_a_partly_steered_batch_keep_the_routers_output(name, dtype):
    """Row 0 is not steered: the routing the experts receive for it is the router's own, bit for bit.

    The model's logits of row 0 can still move in the last bits: the experts batch tokens by expert
    (grouped matmul), so steering row 1 changes the matrix shapes row 0's tokens are multiplied in.
    That is outside the router; with no row active nothing is recomputed and the outputs are
    bit-identical (test above).
    """
    model = mf.build(name, dtype=dtype)
    ids = _prompt(seed=4, shape=(2, 9))
    edit = _suppress_top(model, ids)
    sites = find_router_sites(model)
    final: dict[int, tuple] = {}
    own: dict[int, tuple] = {}
    handles = [s.module.register_forward_hook(  # appended: runs after the steering hook
        lambda _m, _a, out, p=s.position: final.__setitem__(p, (out[1].clone(), out[2].clone()))) for s in sites]
    try:
        with torch.no_grad():
            reference = model(input_ids=ids).logits
            with steer_routing(model, edit, schedule=_Rows([False, True])) as handle:
                # prepended after the steering hook: sees the router's own output first
                with RouterHooks(model, lambda site, _l, out: own.__setitem__(site.position, (out[1], out[2]))):
                    mixed = model(input_ids=ids).logits
    finally:
        for h in handles:
            h.remove()
    assert handle.recomputed == len(sites)
    n = ids.shape[1]
    for site in sites:
        (own_w, own_i), (new_w, new_i) = own[site.position], final[site.position]
        assert torch.equal(new_w[:n], own_w[:n]) and torch.equal(new_i[:n], own_i[:n])
        assert not torch.isin(new_i[n:], torch.tensor(edit.suppress[site.layer])).any()  # row 1: steered
    assert torch.isin(own[0][1][:n], torch.tensor(edit.suppress[sites[0].layer])).any()  # row 0 had work to keep
    torch.testing.assert_close(mixed[0], reference[0], rtol=0, atol=1e-5 if dtype == torch.float32 else 0.05)
    assert not torch.allclose(mixed[1], reference[1])


class _OpLog(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: list[str] = []
        self.copies: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func.overloadpacket.__name__)
        self.ops.append(name)
        if name in ("_to_copy", "copy_") and "device" in kwargs:
            self.copies.append(name)
        return func(*args, **kwargs)


HOST_OPS = {"_local_scalar_dense", "lift_fresh", "lift_fresh_copy", "index_put_", "index_put", "nonzero"}


def test_hook_adds_no_host_sync_and_no_host_built_tensors():
    model = mf.build("qwen3_moe", dtype=torch.bfloat16)
    ids = _prompt(shape=(2, 7))
    sites = find_router_sites(model)
    edit = RoutingEdit.from_sets({s.layer: [0] for s in sites}, {s.layer: [1, 2, 3] for s in sites})
    with torch.no_grad():
        with _OpLog() as plain:
            model(input_ids=ids)
        with steer_routing(model, edit) as handle, _OpLog() as steered:
            model(input_ids=ids)
    assert handle.recomputed == len(sites)
    added = [op for op in steered.ops if op in HOST_OPS]
    assert sorted(added) == sorted(op for op in plain.ops if op in HOST_OPS)
    # the fused edit: a bounded number of kernels per layer (counted, not timed)
    per_layer = (len(steered.ops) - len(plain.ops)) / len(sites)
    assert 0 < per_layer <= 14, per_layer


def test_edit_ops_of_one_layer_touch_no_host_data():
    model = mf.build("gemma4", dtype=torch.bfloat16)
    site = find_router_sites(model)[0]
    edit = RoutingEdit.from_sets({site.layer: [3]}, {site.layer: [0, 1]})
    layer = LayerEdit.prepare(site, edit, torch.device("cpu"))
    logits = torch.randn(5, site.n_experts).to(torch.bfloat16)
    output = (logits, torch.zeros(5, site.top_k, dtype=torch.float32), torch.zeros(5, site.top_k, dtype=torch.long))
    rows = torch.tensor([True, False, True, True, False])[:, None]
    with _OpLog() as log:
        new = edited_routing(layer, logits, output, rows)
    assert not [op for op in log.ops if op in HOST_OPS], log.ops
    assert not log.copies
    # independent check of the values: softmax over the edited fp32 logits, top-2, renorm, * scale
    x = logits.float()
    lo, hi = x.min(-1).values, x.max(-1).values
    x[:, 0], x[:, 1], x[:, 3] = lo - 0.01, lo - 0.01, hi + 0.01
    p = torch.softmax(x, -1)
    w, i = p.topk(2, -1)
    w = w / w.sum(-1, keepdim=True) * site.module.per_expert_scale.float()[i]
    keep = rows[:, 0]
    assert torch.equal(new[2][keep], i[keep]) and torch.equal(new[2][~keep], output[2][~keep])
    torch.testing.assert_close(new[1][keep], w[keep], rtol=1e-6, atol=1e-7)
    assert torch.equal(new[1][~keep], output[1][~keep])
