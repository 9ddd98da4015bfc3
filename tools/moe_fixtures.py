"""The mixture-of-experts fixtures of make_fixtures.py (Mixtral, Qwen2-MoE, Qwen3-MoE).

Each covers a case the MoE layer's split must get right (docs/architecture.md, "The MoE layer"):
  mixtral_moe_top3          5 experts (divisible by neither tp 2 nor tp 4), top-3, every layer sparse;
                            saved as transformers 5's save_pretrained writes it (the published
                            per-expert names block_sparse_moe.experts.{e}.w1/w2/w3).
  qwen2_moe_shared_mixed    4 experts, top-2 renormalised, the sigmoid-gated shared expert,
                            decoder_sparse_step 2 (layers 0 and 2 dense, layer 1 sparse), q/k/v biases.
  qwen3_moe_top1_fused      6 experts, top-1 without renormalisation, per-head q/k norms,
                            mlp_only_layers [0] (layer 0 dense); written in transformers 5's in-memory
                            form, the experts of a layer stacked into mlp.experts.gate_up_proj
                            [experts, 2*moe_intermediate, hidden] and mlp.experts.down_proj
                            [experts, hidden, moe_intermediate] (which from_pretrained also reads).
"""

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN_TOKENIZER = {"kind": "byte_level", "style": "qwen2", "specials": QWEN_SPECIALS, "specials_at_end": True,
                  "bos": None, "eos": "<|im_end|>", "pad": "<|endoftext|>", "add_bos": False}

MOE_FIXTURES = [
    {
        "name": "mixtral_moe_top3",
        "seed": 1101,
        "tokenizer": {"kind": "metaspace", "bos": "<s>", "eos": "</s>", "unk": "<unk>", "add_bos": True},
        "config": {
            "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_act": "silu",
            "hidden_size": 64, "intermediate_size": 32, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2,
            "num_local_experts": 5, "num_experts_per_tok": 3, "router_jitter_noise": 0.0,
            "output_router_logits": False,
            "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 1000000.0, "rope_scaling": None,
            "sliding_window": None, "tie_word_embeddings": False, "attention_dropout": 0.0,
            "vocab_size": 384, "initializer_range": 0.2, "use_cache": True,
            "torch_dtype": "float32",
        },
    },
    {
        "name": "qwen2_moe_shared_mixed",
        "seed": 1202,
        "tokenizer": QWEN_TOKENIZER,
        "config": {
            "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "hidden_act": "silu",
            "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3,
            "num_attention_heads": 4, "num_key_value_heads": 2,
            "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 64, "norm_topk_prob": True,
            "decoder_sparse_step": 2, "mlp_only_layers": [], "qkv_bias": True,
            "router_aux_loss_coef": 0.0, "output_router_logits": False,
            "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_scaling": None,
            "use_sliding_window": False, "sliding_window": None, "max_window_layers": 3,
            "tie_word_embeddings": False, "attention_dropout": 0.0,
            "vocab_size": 512, "initializer_range": 0.2, "use_cache": True,
            "torch_dtype": "float32",
        },
    },
    {
        "name": "qwen3_moe_top1_fused",
        "seed": 1303,
        "fused_experts": True,
        "tokenizer": QWEN_TOKENIZER,
        "config": {
            "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_act": "silu",
            "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
            "num_experts": 6, "num_experts_per_tok": 1, "moe_intermediate_size": 32,
            "norm_topk_prob": False, "decoder_sparse_step": 1, "mlp_only_layers": [0],
            "router_aux_loss_coef": 0.0, "output_router_logits": False,
            "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_scaling": None,
            "use_sliding_window": False, "sliding_window": None, "max_window_layers": 2,
            "tie_word_embeddings": False, "attention_bias": False, "attention_dropout": 0.0,
            "vocab_size": 512, "initializer_range": 0.2, "use_cache": True,
            "torch_dtype": "float32",
        },
    },
]


def save_fused_experts(model, out_dir, tied):
    """Writes the model's state dict as transformers 5 holds it in memory: each sparse layer's experts
    stacked into mlp.experts.gate_up_proj / mlp.experts.down_proj (save_pretrained would split them
    back into the published per-expert tensors)."""
    import os
    from safetensors.torch import save_file
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()
             if not (tied and k == "lm_head.weight")}
    if not any(k.endswith("mlp.experts.gate_up_proj") for k in state):
        raise RuntimeError("the model holds no stacked experts (mlp.experts.gate_up_proj)")
    save_file(state, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
