"""Tiny random-weight MoE models built from transformers config classes (no downloads).

Every model has 2 decoder layers, hidden size 32-64, 4-16 experts and a vocabulary of 128 tokens,
so that a forward pass takes milliseconds on a shared CPU. Router weights are redrawn from
``N(0, ROUTER_STD)`` after construction: with the default 0.02 initialisation every router is
nearly uniform, top-k ties are common and steering would change nothing measurable
(../shared/notes/moe-routers.md, pitfall 10).

Used by ``tests/test_steer*.py`` and ``benchmarks/bench_steer.py``.
"""

from __future__ import annotations

from typing import Callable

VOCAB = 128
ROUTER_STD = 2.0
PAD_ID = 0


def _attn(hidden: int = 32, heads: int = 2, kv: int = 1, head_dim: int = 16) -> dict:
    return dict(
        vocab_size=VOCAB,
        hidden_size=hidden,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=head_dim,
        max_position_embeddings=256,
        pad_token_id=PAD_ID,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )


def _qwen3_moe():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(**_attn(), intermediate_size=64, moe_intermediate_size=16, num_experts=8,
                         num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])
    return Qwen3MoeForCausalLM(cfg)


def _qwen3_moe_no_renorm():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(**_attn(), intermediate_size=64, moe_intermediate_size=16, num_experts=8,
                         num_experts_per_tok=2, norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[])
    return Qwen3MoeForCausalLM(cfg)


def _qwen2_moe():
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    cfg = Qwen2MoeConfig(**_attn(), intermediate_size=64, moe_intermediate_size=16, shared_expert_intermediate_size=32,
                         num_experts=8, num_experts_per_tok=2, norm_topk_prob=False, decoder_sparse_step=1,
                         mlp_only_layers=[])
    return Qwen2MoeForCausalLM(cfg)


def _mixtral():
    from transformers import MixtralConfig, MixtralForCausalLM

    cfg = MixtralConfig(**_attn(), intermediate_size=16, num_local_experts=4, num_experts_per_tok=2)
    return MixtralForCausalLM(cfg)


def _olmoe():
    from transformers import OlmoeConfig, OlmoeForCausalLM

    kw = _attn()
    kw.pop("head_dim")
    cfg = OlmoeConfig(**kw, intermediate_size=16, num_experts=8, num_experts_per_tok=2, norm_topk_prob=False)
    return OlmoeForCausalLM(cfg)


def _gpt_oss():
    from transformers import GptOssConfig, GptOssForCausalLM

    cfg = GptOssConfig(**_attn(), intermediate_size=16, num_local_experts=4, num_experts_per_tok=2,
                       sliding_window=8, layer_types=["sliding_attention", "full_attention"])
    return GptOssForCausalLM(cfg)


def _qwen3_5_text_kwargs() -> dict:
    return dict(**_attn(), moe_intermediate_size=16, shared_expert_intermediate_size=16, num_experts=8,
                num_experts_per_tok=2, layer_types=["linear_attention", "full_attention"],
                linear_conv_kernel_dim=2, linear_key_head_dim=8, linear_value_head_dim=8,
                linear_num_key_heads=2, linear_num_value_heads=2)


def _qwen3_5_moe():
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    return Qwen3_5MoeForCausalLM(Qwen3_5MoeTextConfig(**_qwen3_5_text_kwargs()))


def _qwen3_next():
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    cfg = Qwen3NextConfig(**_attn(), intermediate_size=32, moe_intermediate_size=16, shared_expert_intermediate_size=16,
                          num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
                          mlp_only_layers=[], layer_types=["linear_attention", "full_attention"],
                          linear_conv_kernel_dim=2, linear_key_head_dim=8, linear_value_head_dim=8,
                          linear_num_key_heads=2, linear_num_value_heads=2)
    return Qwen3NextForCausalLM(cfg)


def _gemma4_text_kwargs() -> dict:
    kw = _attn()
    kw["tie_word_embeddings"] = True
    return dict(**kw, intermediate_size=32, moe_intermediate_size=16, enable_moe_block=True, num_experts=8,
                top_k_experts=2, hidden_size_per_layer_input=0, global_head_dim=16, sliding_window=8,
                layer_types=["sliding_attention", "full_attention"], num_kv_shared_layers=0)


def _gemma4():
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    return Gemma4ForCausalLM(Gemma4TextConfig(**_gemma4_text_kwargs()))


def _tiny_vision(kind: str) -> dict:
    if kind == "qwen":
        return dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=32, patch_size=4,
                    temporal_patch_size=1, spatial_merge_size=1, num_position_embeddings=16)
    return dict(hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=2, head_dim=8, patch_size=4)


def _qwen3_5_moe_vl():
    from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

    cfg = Qwen3_5MoeConfig(text_config=_qwen3_5_text_kwargs(), vision_config=_tiny_vision("qwen"),
                           image_token_id=120, video_token_id=121, vision_start_token_id=122, vision_end_token_id=123)
    return Qwen3_5MoeForConditionalGeneration(cfg)


def _gemma4_vl():
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration

    cfg = Gemma4Config(text_config=_gemma4_text_kwargs(), vision_config=_tiny_vision("gemma"), audio_config=None,
                       boi_token_id=120, eoi_token_id=121, image_token_id=122, video_token_id=123,
                       boa_token_id=124, eoa_token_index=125, audio_token_id=126)
    return Gemma4ForConditionalGeneration(cfg)


def _mla_attn() -> dict:
    kw = _attn(kv=2)
    kw.pop("head_dim")
    return dict(**kw, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8, v_head_dim=16, qk_nope_head_dim=8)


def _deepseek_v3():
    """16 routed experts in 4 groups of 4, 2 groups kept, top-3, renormalised, scaled by 2.5, 1 shared expert."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    cfg = DeepseekV3Config(**_mla_attn(), intermediate_size=64, moe_intermediate_size=16, n_routed_experts=16,
                           n_shared_experts=1, num_experts_per_tok=3, n_group=4, topk_group=2, first_k_dense_replace=0,
                           norm_topk_prob=True, routed_scaling_factor=2.5)
    return DeepseekV3ForCausalLM(cfg)


def _glm4_moe():
    """8 routed experts in 2 groups of 4, 1 group kept, top-2, not renormalised, scaled by 1.5, 1 shared expert."""
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM

    cfg = Glm4MoeConfig(**_attn(kv=2), intermediate_size=64, moe_intermediate_size=16, n_routed_experts=8,
                        n_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=0,
                        norm_topk_prob=False, routed_scaling_factor=1.5)
    return Glm4MoeForCausalLM(cfg)


#: name -> builder of an untrained tiny model of that family.
BUILDERS: dict[str, Callable] = {
    "qwen3_moe": _qwen3_moe,
    "qwen3_moe_no_renorm": _qwen3_moe_no_renorm,
    "qwen2_moe": _qwen2_moe,
    "mixtral": _mixtral,
    "olmoe": _olmoe,
    "gpt_oss": _gpt_oss,
    "qwen3_5_moe": _qwen3_5_moe,
    "qwen3_next": _qwen3_next,
    "gemma4": _gemma4,
    "qwen3_5_moe_vl": _qwen3_5_moe_vl,
    "gemma4_vl": _gemma4_vl,
    "deepseek_v3": _deepseek_v3,
    "glm4_moe": _glm4_moe,
}


def scale_routers(model, std: float = ROUTER_STD, seed: int = 0) -> None:
    """Redraw every router weight from N(0, std) so routing is far from uniform."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _name, module in model.named_modules():
            cls = type(module).__name__
            weight = None
            if cls.endswith("TopKRouter"):
                weight = module.weight
            elif cls == "Gemma4TextRouter":
                weight = module.proj.weight
                module.per_expert_scale.copy_(0.5 + torch.rand(module.per_expert_scale.shape, generator=gen))
            if weight is not None:
                weight.copy_(torch.randn(weight.shape, generator=gen, dtype=torch.float32).to(weight.dtype) * std)
            if cls.endswith("TopKRouter") and getattr(module, "bias", None) is not None:
                module.bias.copy_(torch.randn(module.bias.shape, generator=gen) * std)
            if cls.endswith("TopkRouter") and hasattr(module, "e_score_correction_bias"):  # sigmoid, grouped routers
                module.weight.copy_(torch.randn(module.weight.shape, generator=gen, dtype=torch.float32).to(
                    module.weight.dtype) * std)
                # a bias of the size of the sigmoid scores' spread, so that it changes selections
                module.e_score_correction_bias.copy_(torch.randn(module.e_score_correction_bias.shape, generator=gen) * 0.3)


def build(name: str, *, seed: int = 0, dtype=None, **config):
    """Build the tiny model ``name`` (a key of :data:`BUILDERS`) in eval mode with scaled routers.

    ``config`` overrides attributes of the model's config before the weights are drawn, e.g.
    ``vocab_size=len(tokenizer)`` and ``max_position_embeddings=4096`` to pair the model with a real
    tokenizer and real traces (text-only families; multimodal ones keep theirs in ``text_config``).
    """
    import torch

    torch.manual_seed(seed)
    model = BUILDERS[name]()
    if config:
        cfg = model.config
        for key, value in config.items():
            setattr(cfg, key, value)
        torch.manual_seed(seed)
        model = type(model)(cfg)
    scale_routers(model, seed=seed)
    if dtype is not None:
        model = model.to(dtype)
    model.eval()
    return model
