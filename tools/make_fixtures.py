#!/usr/bin/env python3
"""Builds tiny random-weight Hugging Face checkpoints and records transformers references.

For every fixture in FIXTURES this writes tests/fixtures/models/<name>/:
  config.json             classic HF keys (torch_dtype, rope_theta, rope_scaling), written by this script
                          and read back through transformers' AutoConfig
  model.safetensors       or model.safetensors.index.json + 2 shards (written by save_pretrained)
  tokenizer.json          trained here with `tokenizers` (byte-level BPE or metaspace BPE + byte_fallback)
  tokenizer_config.json
  reference.json          {"name", "torch_dtype", "tolerance_note", "stats", "prompts": [{"text", "ids",
                          "last_logits", "last_logits_native", "greedy", "greedy_margins"}]}

Weights are random (normal, std = initializer_range) with every RMSNorm weight drawn
as 1 + 0.2 * randn (0.2 * randn for Gemma, whose norms scale by 1 + weight: "norm_center")
and every bias as 0.2 * randn, so a loader that leaves norms at 1 or skips biases fails.
Gemma references run transformers' eager attention ("attn_implementation"). The reference is computed from the SAVED checkpoint, loaded with
transformers in float32 on CPU (bf16/f16 weights upcast on load):
  last_logits         [vocab] logits at the last prompt position
  greedy              16 ids from generate(do_sample=False, min_new_tokens=16, max_new_tokens=16,
                      use_cache=True) with no EOS and no logit processors (pure argmax)
  greedy_margins      top1 - top2 logit at each greedy step
  last_logits_native  the same as last_logits, but computed by torch in the checkpoint dtype
Prompts are picked from a candidate list: 4 whose length is in 3..20 tokens and whose
greedy margins all exceed MIN_MARGIN (so an fp32 engine's greedy ids are stable),
including the shortest and the longest such candidate.

Deterministic (fixed seeds, torch deterministic algorithms); rerunning rewrites the
same files given the same torch/transformers/tokenizers versions.

Usage: python3 tools/make_fixtures.py [--out tests/fixtures/models] [--only NAME ...]
"""

import argparse
import json
import os
import random
import shutil
import sys
import tempfile

from moe_fixtures import MOE_FIXTURES, save_fused_experts

MIN_MARGIN = 2e-3      # smallest accepted top1-top2 logit gap in a greedy continuation
NEW_TOKENS = 16
MAX_FIXTURE_BYTES = 1_500_000

# ----------------------------------------------------------------------------
# Fixture definitions
# ----------------------------------------------------------------------------

BYTE_LEVEL_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"]
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
METASPACE_SPECIALS = ["<unk>", "<s>", "</s>"]

FIXTURES = [
    {
        "name": "llama_gqa_f32",
        "seed": 101,
        "tokenizer": {"kind": "byte_level", "specials": BYTE_LEVEL_SPECIALS, "specials_at_end": False,
                      "bos": "<|begin_of_text|>", "eos": "<|end_of_text|>", "pad": "<|pad|>", "add_bos": True},
        "config": {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
            "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2,
            "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "rope_scaling": None,
            "tie_word_embeddings": False, "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False,
            "vocab_size": 512, "initializer_range": 0.2, "pretraining_tp": 1, "use_cache": True,
            "torch_dtype": "float32",
        },
    },
    {
        "name": "llama_mha_tied_bf16",
        "seed": 202,
        "online_fp8": True,  # also reference_online_fp8.json (model.quantization = "fp8")
        "tokenizer": {"kind": "metaspace", "bos": "<s>", "eos": "</s>", "unk": "<unk>", "add_bos": True},
        "config": {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
            "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 4,
            "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
            "rope_scaling": {"rope_type": "linear", "factor": 2.0},
            "tie_word_embeddings": True, "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False,
            "vocab_size": 512, "initializer_range": 0.2, "pretraining_tp": 1, "use_cache": True,
            "torch_dtype": "bfloat16",
        },
    },
    {
        "name": "qwen2_bias_f16",
        "seed": 303,
        "tokenizer": {"kind": "byte_level", "style": "qwen2", "specials": QWEN_SPECIALS, "specials_at_end": True,
                      "bos": None, "eos": "<|im_end|>", "pad": "<|endoftext|>", "add_bos": False},
        "config": {
            "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
            "hidden_size": 96, "intermediate_size": 192, "num_hidden_layers": 2,
            "num_attention_heads": 6, "num_key_value_heads": 2,
            "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_scaling": None,
            "tie_word_embeddings": False, "attention_dropout": 0.0,
            "use_sliding_window": False, "sliding_window": None, "max_window_layers": 2,
            "vocab_size": 1001, "initializer_range": 0.2, "use_cache": True,
            "torch_dtype": "float16",
            # bos/eos filled from the tokenizer; eos is a list (<|im_end|>, <|endoftext|>) as in Qwen2.5.
        },
        "eos_list": ["<|im_end|>", "<|endoftext|>"],
        "bos_token_name": "<|endoftext|>",
    },
    {
        "name": "llama3_headdim_sharded",
        "seed": 404,
        "shards": 2,
        "tokenizer": {"kind": "byte_level", "specials": BYTE_LEVEL_SPECIALS, "specials_at_end": False,
                      "bos": "<|begin_of_text|>", "eos": "<|end_of_text|>", "pad": None, "add_bos": True},
        "config": {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
            "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
            "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
            "tie_word_embeddings": False, "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False,
            "vocab_size": 512, "initializer_range": 0.2, "pretraining_tp": 1, "use_cache": True,
            "torch_dtype": "float32",
        },
    },
    {
        "name": "qwen3_qknorm_tied",
        "seed": 606,
        "tokenizer": {"kind": "byte_level", "style": "qwen2", "specials": QWEN_SPECIALS, "specials_at_end": True,
                      "bos": None, "eos": "<|im_end|>", "pad": "<|endoftext|>", "add_bos": False},
        "config": {
            # head_dim 32 with hidden 64 and 4 heads: q_proj is [128, 64], decoupled from hidden/heads.
            "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_act": "silu",
            "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
            "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_scaling": None,
            "tie_word_embeddings": True, "attention_bias": False, "attention_dropout": 0.0,
            "use_sliding_window": False, "sliding_window": None, "max_window_layers": 2,
            "vocab_size": 512, "initializer_range": 0.2, "use_cache": True,
            "torch_dtype": "float32",
        },
        "eos_list": ["<|im_end|>", "<|endoftext|>"],
        "bos_token_name": "<|endoftext|>",
    },
    {
        "name": "phi3_fused_longrope_bf16",
        "seed": 707,
        "tokenizer": {"kind": "metaspace", "bos": "<s>", "eos": "</s>", "unk": "<unk>", "add_bos": True},
        "config": {
            # Fused qkv_proj [(8 + 2*4) * 8, 64] and gate_up_proj [2 * 96, 64]; 8 heads so that tp 8
            # splits it (and 4 KV heads are replicated at tp 8). Longrope switches from the short to
            # the long factors past original_max_position_embeddings = 16, which the longer prompts
            # and every greedy continuation cross; attention_factor = sqrt(1 + ln 4 / ln 16).
            "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_act": "silu",
            "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
            "num_attention_heads": 8, "num_key_value_heads": 4,
            "max_position_embeddings": 64, "original_max_position_embeddings": 16,
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
            "rope_scaling": {"type": "longrope", "short_factor": [1.0, 1.25, 1.5, 2.0],
                             "long_factor": [1.5, 3.0, 6.0, 12.0]},
            "sliding_window": None, "tie_word_embeddings": False, "attention_dropout": 0.0,
            "resid_pdrop": 0.0, "embd_pdrop": 0.0,
            "pad_token_id": None,  # Phi3Config's default (32000) is outside this vocab
            "vocab_size": 512, "initializer_range": 0.2, "use_cache": True,
            "torch_dtype": "bfloat16",
        },
        "rope_type": "longrope",
    },
    {
        "name": "mistral_sliding_window",
        "seed": 808,
        "tokenizer": {"kind": "metaspace", "bos": "<s>", "eos": "</s>", "unk": "<unk>", "add_bos": True},
        "config": {
            # A 5-position window: every prompt (up to 20 tokens) and its 16 greedy tokens run past
            # it, so positions fall out of the window in prefill and in decode.
            "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_act": "silu",
            "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
            "rope_scaling": None, "sliding_window": 5,
            "tie_word_embeddings": False, "attention_dropout": 0.0,
            "vocab_size": 384, "initializer_range": 0.2, "use_cache": True,
            "torch_dtype": "float32",
        },
        "require_prompt_longer_than_window": True,
    },
    {
        "name": "gemma2_softcap_window",
        "seed": 909,
        "tokenizer": {"kind": "metaspace", "bos": "<s>", "eos": "</s>", "unk": "<unk>", "add_bos": True},
        "config": {
            # Gemma 2: (1 + w) RMSNorms before and after attention and the MLP, GeGLU (tanh gelu),
            # embeddings scaled by sqrt(hidden), attention scale query_pre_attn_scalar^-0.5 (24, not
            # head_dim 32), tanh soft-capping of the attention scores (cap 3: the scores of these
            # weights reach it) and of the final logits (cap 10), a 4-position window on the even
            # layers (transformers' default layer_types) that every prompt passes, a tied head.
            "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2",
            "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
            "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
            "query_pre_attn_scalar": 24, "max_position_embeddings": 256, "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0, "rope_scaling": None, "sliding_window": 4,
            "attn_logit_softcapping": 3.0, "final_logit_softcapping": 10.0,
            "tie_word_embeddings": True, "attention_bias": False, "attention_dropout": 0.0,
            "pad_token_id": 0, "vocab_size": 512, "initializer_range": 0.2, "use_cache": True,
            "torch_dtype": "float32",
        },
        "norm_center": 0.0,  # Gemma's RMSNorm scales by (1 + weight); transformers initialises it at 0
        "attn_implementation": "eager",
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        "require_prompt_longer_than_window": True,
    },
    {
        "name": "gemma3_text_local_rope_bf16",
        "seed": 1010,
        "tokenizer": {"kind": "metaspace", "bos": "<s>", "eos": "</s>", "unk": "<unk>", "add_bos": True},
        "config": {
            # Gemma 3 (text): Gemma 2's layer plus per-head (1 + w) q_norm/k_norm, sliding layers
            # from sliding_window_pattern 3 (layers 0, 1 and 3; layer 2 global) rotating with
            # rope_local_base_freq (100: far from the global table) while the global layer uses
            # rope_theta with linear scaling x4; a 6-position window; no soft-capping (the
            # published configs have none); a tied head; bfloat16.
            "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
            "hidden_activation": "gelu_pytorch_tanh",
            "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
            "query_pre_attn_scalar": 32, "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0, "rope_local_base_freq": 100.0,
            "rope_scaling": {"rope_type": "linear", "factor": 4.0},
            "sliding_window": 6, "sliding_window_pattern": 3,
            "attn_logit_softcapping": None, "final_logit_softcapping": None,
            "use_bidirectional_attention": False,
            "tie_word_embeddings": True, "attention_bias": False, "attention_dropout": 0.0,
            "pad_token_id": 0, "vocab_size": 512, "initializer_range": 0.2, "use_cache": True,
            "torch_dtype": "bfloat16",
        },
        "norm_center": 0.0,
        "attn_implementation": "eager",
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
        "local_rope_theta": 100.0,
        "require_prompt_longer_than_window": True,
    },
    {
        # HF "fp8" (FineGrainedFP8Config's layout, tools/fp8_fixtures.py): 32x32 blocks so that tp 2
        # cuts blocks (k/v_proj: 32 rows -> 16 per rank; gate/up: 96 -> 48; down_proj's columns too).
        "name": "llama_fp8_block",
        "seed": 1111,
        "fp8": {"format": "fp8", "block": [32, 32]},
        "tokenizer": {"kind": "byte_level", "specials": BYTE_LEVEL_SPECIALS, "specials_at_end": False,
                      "bos": "<|begin_of_text|>", "eos": "<|end_of_text|>", "pad": "<|pad|>", "add_bos": True},
        "config": {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
            "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2,
            "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "rope_scaling": None,
            "tie_word_embeddings": False, "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False,
            "vocab_size": 512, "initializer_range": 0.2, "pretraining_tp": 1, "use_cache": True,
            "torch_dtype": "bfloat16",
        },
    },
    {
        # compressed-tensors FP8_DYNAMIC (per-channel weight scales, dynamic activations) on Qwen3.
        "name": "qwen3_fp8_channel_ct",
        "seed": 1212,
        "fp8": {"format": "compressed-tensors"},
        "tokenizer": {"kind": "byte_level", "style": "qwen2", "specials": QWEN_SPECIALS, "specials_at_end": True,
                      "bos": None, "eos": "<|im_end|>", "pad": "<|endoftext|>", "add_bos": False},
        "config": {
            "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_act": "silu",
            "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_scaling": None,
            "tie_word_embeddings": True, "attention_bias": False, "attention_dropout": 0.0,
            "use_sliding_window": False, "sliding_window": None, "max_window_layers": 2,
            "vocab_size": 512, "initializer_range": 0.2, "use_cache": True,
            "torch_dtype": "bfloat16",
        },
        "eos_list": ["<|im_end|>", "<|endoftext|>"],
        "bos_token_name": "<|endoftext|>",
    },
    {
        "name": "mistral_dynamic",
        "seed": 505,
        "tokenizer": {"kind": "metaspace", "bos": "<s>", "eos": "</s>", "unk": "<unk>", "add_bos": True},
        "config": {
            "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_act": "silu",
            "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 16,
            "max_position_embeddings": 16, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
            "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}, "sliding_window": None,
            "tie_word_embeddings": False, "attention_dropout": 0.0,
            "vocab_size": 384, "initializer_range": 0.2, "use_cache": True,
            "torch_dtype": "float32",
        },
        "require_long_prompt_over_max_pos": True,
    },
]

FIXTURES += MOE_FIXTURES  # tools/moe_fixtures.py

# Candidate prompts. Of those that pass (3..20 tokens, margins >= MIN_MARGIN), a fixture keeps
# the shortest, the longest and then the first others in this order, up to 4.
CANDIDATE_PROMPTS = [
    "the cat",
    "a small dog runs over the green hill",
    "\u2603 snow",  # a snowman: not in any trained vocabulary (byte fallback / raw bytes)
    "is this the way to the station?",
    "the old man and the sea, 1952.",
    "rain on the roof at night",
    "The Quick Brown Fox",
    "hello world!",
    "one two three four five six seven",
    "numbers like 31415 and 27 are fine",
    "caf\u00e9 \u00fcber \u65e5\u672c",
    "where do the birds go in winter",
    "hi",
]

# ----------------------------------------------------------------------------
# Tokenizer training corpus (deterministic, generated)
# ----------------------------------------------------------------------------

WORDS = """the a an and or but if then when where while because so of to in on at by for with from
about over under between through after before during without within along across behind near
i you he she it we they me him her us them my your his its our their this that these those
is are was were be been being have has had do does did will would can could should may might must
cat dog bird fish horse cow sheep mouse lion tiger bear wolf fox rabbit duck goose owl snake frog
house home room door window wall floor roof garden street road city town village country world
river lake sea ocean mountain hill valley forest tree flower grass leaf rock sand stone field
sun moon star sky cloud rain snow wind storm weather morning evening night day week month year
time hour minute second today tomorrow yesterday spring summer autumn winter season
red blue green yellow black white brown orange purple gray dark light bright
big small large little long short tall high low old new young fast slow quick lazy happy sad
good bad better best great fine nice kind warm cold hot cool soft hard easy simple strong weak
run walk jump swim fly sit stand sleep eat drink read write speak talk say tell ask answer
go come leave arrive stay move turn open close start stop begin end make take give get put keep
see look watch hear listen feel think know learn teach understand remember forget believe
love like want need help try use work play build break find lose win buy sell pay send bring
one two three four five six seven eight nine ten eleven twelve hundred thousand million first last
book letter word story song music picture paper page line name number question problem idea
man woman child boy girl friend family mother father brother sister teacher student doctor
food bread water milk tea coffee apple orange egg rice meat cheese soup cake sugar salt
market station school office shop hospital library museum church bridge park farm
computer program code data model token system network memory engine server file list table
quick brown jumps lazy talked walked weather station birds lakes freeze nights grow
café naïve über résumé façade jalapeño""".split()


def make_corpus(seed, n_sentences=4000):
    rng = random.Random(seed)
    punct = [".", ".", ".", ",", "!", "?", ";", ":"]
    lines = []
    for _ in range(n_sentences):
        n = rng.randint(4, 14)
        words = []
        for j in range(n):
            w = rng.choice(WORDS)
            r = rng.random()
            if r < 0.08:
                w = w.capitalize()
            elif r < 0.11:
                w = str(rng.randint(0, 9999))
            elif r < 0.13:
                w = "\"" + w + "\""
            words.append(w)
            if j < n - 1 and rng.random() < 0.07:
                words[-1] += ","
        lines.append(" ".join(words) + rng.choice(punct))
    return lines


def _merges_from(tok):
    model = json.loads(tok.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return model["vocab"], merges


# Qwen2's pre-tokenizer split pattern (as in Qwen2's tokenizer.json).
QWEN2_SPLIT_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                     r"\s*[\r\n]+|\s+(?!\S)|\s+")


def byte_level_pipeline(tok, style):
    """GPT-2 style: ByteLevel with its built-in regex. Qwen2 style: NFC, Split(regex), ByteLevel."""
    from tokenizers import Regex, normalizers, pre_tokenizers
    if style == "qwen2":
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    else:
        tok.normalizer = None
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)


def train_byte_level(spec, vocab_size, seed):
    from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers, processors, trainers
    from tokenizers.models import BPE

    specials = spec["specials"]
    style = spec.get("style", "gpt2")
    tok = Tokenizer(BPE(fuse_unk=False, byte_fallback=False))
    byte_level_pipeline(tok, style)
    n_model = vocab_size - len(specials) if spec["specials_at_end"] else vocab_size
    trainer = trainers.BpeTrainer(
        vocab_size=n_model, min_frequency=1, show_progress=False,
        special_tokens=[] if spec["specials_at_end"] else specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(make_corpus(seed), trainer=trainer)
    vocab, merges = _merges_from(tok)
    # Rebuild from vocab + merges so the saved model is exactly what a loader sees.
    out = Tokenizer(BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    byte_level_pipeline(out, style)
    out.decoder = decoders.ByteLevel()
    out.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    post = processors.ByteLevel(trim_offsets=False)
    if spec["add_bos"]:
        bos = spec["bos"]
        post = processors.Sequence([post, processors.TemplateProcessing(
            single="%s $A" % bos, pair="%s $A %s:1 $B:1" % (bos, bos),
            special_tokens=[(bos, out.token_to_id(bos))])])
    out.post_processor = post
    return out


def train_metaspace(spec, vocab_size, seed):
    from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers, processors, trainers
    from tokenizers.models import BPE

    specials = METASPACE_SPECIALS
    tok = Tokenizer(BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=True)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - 256, min_frequency=1, show_progress=False,
                                  special_tokens=specials)
    tok.train_from_iterator(make_corpus(seed), trainer=trainer)
    trained, merges = _merges_from(tok)
    # Llama-style layout: <unk> <s> </s>, then the 256 byte tokens <0x00>..<0xFF>, then the pieces.
    vocab = {s: i for i, s in enumerate(specials)}
    for b in range(256):
        vocab["<0x%02X>" % b] = len(specials) + b
    for piece, i in sorted(trained.items(), key=lambda kv: kv[1]):
        if piece in specials:
            continue
        if piece in vocab:
            raise RuntimeError("trained piece %r collides with a byte token" % piece)
        vocab[piece] = i + 256
    out = Tokenizer(BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    out.normalizer = None
    # split=False as in current Llama-2/Mistral tokenizer.json files; the trained merges never span a
    # "▁" inside a piece, so this encodes like the split=True tokenizer used for training.
    out.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    out.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(content=" ", left=1, right=0)])
    out.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    if spec["add_bos"]:
        bos = spec["bos"]
        out.post_processor = processors.TemplateProcessing(
            single="%s $A" % bos, pair="%s $A %s:1 $B:1" % (bos, bos),
            special_tokens=[(bos, out.token_to_id(bos))])
    return out


# ----------------------------------------------------------------------------
# Model helpers
# ----------------------------------------------------------------------------

def f32(x):
    """Shortest decimal that round-trips the float32 value of x."""
    import numpy as np
    return float(str(np.float32(x)))


def reset_dynamic_rope(model):
    """Returns every rotary embedding to its un-scaled state.

    transformers' dynamic NTK rope keeps state across forward calls (it only grows inv_freq
    while seq_len exceeds the largest seen so far). Resetting before each prompt makes each
    reference equal to the stateless rule: a forward whose largest position is p uses the
    base computed for seq_len = p + 1 (when p + 1 > max_position_embeddings).
    """
    import torch
    for m in model.modules():
        if hasattr(m, "original_inv_freq") and hasattr(m, "max_seq_len_cached"):
            m.register_buffer("inv_freq", m.original_inv_freq.clone(), persistent=False)
            m.max_seq_len_cached = m.original_max_seq_len
    torch.manual_seed(0)


def randomize(model, seed, norm_center=1.0):
    import torch
    g = torch.Generator().manual_seed(seed + 7)
    n_norm = n_bias = 0
    with torch.no_grad():
        for mod_name, mod in model.named_modules():
            if type(mod).__name__.endswith("RMSNorm"):
                mod.weight.copy_(norm_center + 0.2 * torch.randn(mod.weight.shape, generator=g))
                n_norm += 1
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
                n_bias += 1
    return n_norm, n_bias


def dir_bytes(d):
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))


# ----------------------------------------------------------------------------
# One fixture
# ----------------------------------------------------------------------------

def build_fixture(fx, out_root):
    import numpy as np
    import torch
    import transformers
    from tokenizers import Tokenizer
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    name = fx["name"]
    d = os.path.join(out_root, name)
    if os.path.exists(d):
        shutil.rmtree(d)
    os.makedirs(d)
    cfg = dict(fx["config"])
    vocab_size = cfg["vocab_size"]
    tspec = fx["tokenizer"]

    # --- tokenizer -----------------------------------------------------------------------------
    if tspec["kind"] == "byte_level":
        tok = train_byte_level(tspec, vocab_size, fx["seed"])
    else:
        tok = train_metaspace(tspec, vocab_size, fx["seed"])
    n_tok = tok.get_vocab_size(with_added_tokens=True)
    if n_tok != vocab_size:
        raise RuntimeError("%s: tokenizer has %d tokens, config vocab_size is %d (corpus too small?)"
                           % (name, n_tok, vocab_size))
    tok.save(os.path.join(d, "tokenizer.json"))
    tid = tok.token_to_id
    bos_name = fx.get("bos_token_name", tspec.get("bos"))
    cfg["bos_token_id"] = tid(bos_name) if bos_name else None
    if "eos_list" in fx:
        cfg["eos_token_id"] = [tid(t) for t in fx["eos_list"]]
    else:
        cfg["eos_token_id"] = tid(tspec["eos"])
    pad = tspec.get("pad")
    if pad:
        cfg["pad_token_id"] = tid(pad)
    tcfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": tspec.get("bos"),
        "eos_token": tspec["eos"],
        "add_bos_token": tspec["add_bos"],
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": cfg["max_position_embeddings"],
    }
    if tspec.get("unk"):
        tcfg["unk_token"] = tspec["unk"]
    if pad:
        tcfg["pad_token"] = pad
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(tcfg, f, indent=2, ensure_ascii=False)
        f.write("\n")
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")

    # --- model ---------------------------------------------------------------------------------
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[cfg["torch_dtype"]]
    hf_cfg = AutoConfig.from_pretrained(d)
    rp = dict(getattr(hf_cfg, "rope_parameters", None) or {})
    want_rope = fx.get("rope_type", (cfg["rope_scaling"] or {}).get("rope_type", "default"))
    if "local_rope_theta" in fx:
        # Gemma 3: one rope per layer type; the sliding layers' is the default one at the local base.
        local = rp.get("sliding_attention") or {}
        if local.get("rope_type") != "default" or abs(local.get("rope_theta", 0) - fx["local_rope_theta"]) > 1e-6:
            raise RuntimeError("%s: transformers read sliding-layer rope parameters %s" % (name, rp))
        rp = dict(rp.get("full_attention") or {})
    if rp.get("rope_type") != want_rope or abs(rp.get("rope_theta", 0) - cfg["rope_theta"]) > 1e-6:
        raise RuntimeError("%s: transformers read rope parameters %s from config.json" % (name, rp))
    if "layer_types" in fx and list(hf_cfg.layer_types) != fx["layer_types"]:
        raise RuntimeError("%s: transformers made layer_types %s from config.json, expected %s"
                           % (name, hf_cfg.layer_types, fx["layer_types"]))
    load_kwargs = {"attn_implementation": fx["attn_implementation"]} if "attn_implementation" in fx else {}
    torch.manual_seed(fx["seed"])
    model = AutoModelForCausalLM.from_config(hf_cfg, dtype=torch.float32, **load_kwargs)
    n_norm, n_bias = randomize(model, fx["seed"], fx.get("norm_center", 1.0))
    model = model.to(dtype)
    with tempfile.TemporaryDirectory() as tmp:
        shards = fx.get("shards", 1)
        if fx.get("fused_experts"):
            save_fused_experts(model, tmp, cfg["tie_word_embeddings"])
        elif shards > 1:
            total = sum(p.numel() * p.element_size() for n, p in model.state_dict().items()
                        if not (cfg["tie_word_embeddings"] and n == "lm_head.weight"))
            model.save_pretrained(tmp, max_shard_size=int(total * 0.6))
        else:
            model.save_pretrained(tmp)
        files = sorted(f for f in os.listdir(tmp) if f.endswith(".safetensors") or f.endswith(".index.json"))
        n_shards = len([f for f in files if f.endswith(".safetensors")])
        if n_shards != shards:
            raise RuntimeError("%s: save_pretrained wrote %d weight files (%s), wanted %d"
                               % (name, n_shards, files, shards))
        for f in files:
            shutil.copy(os.path.join(tmp, f), os.path.join(d, f))
    del model
    # FP8 fixtures (tools/fp8_fixtures.py): the saved checkpoint is rewritten in the FP8 format; the
    # reference loads `ref_dir` (transformers itself for HF fp8, the dequantized weights otherwise).
    ref_dir = d
    fp8 = fx.get("fp8")
    if fp8:
        import fp8_fixtures
        dense_dir = tempfile.mkdtemp(prefix="fp8-dense-")
        fp8_fixtures.quantize_checkpoint(d, fp8, dense_dir)
        if fp8["format"] != "fp8":
            ref_dir = dense_dir

    # --- reference -----------------------------------------------------------------------------
    raw = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    hf_tok = AutoTokenizer.from_pretrained(d)
    m32, info = AutoModelForCausalLM.from_pretrained(ref_dir, dtype=torch.float32, output_loading_info=True,
                                                     **load_kwargs)
    if any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")):
        raise RuntimeError("%s: loading the saved checkpoint: %s" % (name, info))
    # An FP8 checkpoint has no native-dtype run on CPU: last_logits_native is left out.
    mnat = m32 if fp8 else AutoModelForCausalLM.from_pretrained(d, dtype=dtype, **load_kwargs)
    for m in (m32, mnat):
        if "attn_implementation" in fx and m.config._attn_implementation != fx["attn_implementation"]:
            raise RuntimeError("%s: transformers runs %s attention" % (name, m.config._attn_implementation))
    m32.eval()
    mnat.eval()
    for m in (m32, mnat):
        m.generation_config.eos_token_id = None
    gen = GenerationConfig(do_sample=False, min_new_tokens=NEW_TOKENS, max_new_tokens=NEW_TOKENS, use_cache=True,
                           eos_token_id=None, pad_token_id=0, return_dict_in_generate=True, output_logits=True)
    # Dynamic NTK and longrope change the rotation with the sequence length; K already in the cache
    # keeps the one it was computed with, so an uncached recompute differs.
    dynamic = want_rope in ("dynamic", "longrope")

    valid = []
    rejected = []
    for text in CANDIDATE_PROMPTS:
        ids = raw.encode(text).ids
        if hf_tok(text)["input_ids"] != ids:
            raise RuntimeError("%s: tokenizers and AutoTokenizer disagree on %r" % (name, text))
        decoded = raw.decode(ids, skip_special_tokens=True)
        if decoded != text:
            raise RuntimeError("%s: decode(encode(%r)) = %r" % (name, text, decoded))
        if not 3 <= len(ids) <= 20:
            rejected.append((text, "length %d" % len(ids)))
            continue
        x = torch.tensor([ids])
        with torch.no_grad():
            reset_dynamic_rope(m32)
            last = m32(x).logits[0, -1].float()
            reset_dynamic_rope(mnat)
            last_nat = mnat(x).logits[0, -1].float()
            reset_dynamic_rope(m32)
            out = m32.generate(x, attention_mask=torch.ones_like(x), generation_config=gen)
        greedy = out.sequences[0, len(ids):].tolist()
        if len(greedy) != NEW_TOKENS:
            raise RuntimeError("%s: generate returned %d tokens" % (name, len(greedy)))
        margins = []
        for step, lg in enumerate(out.logits):
            top = torch.topk(lg[0].float(), 2)
            if int(top.indices[0]) != greedy[step]:
                raise RuntimeError("%s: greedy id at step %d is not the argmax" % (name, step))
            margins.append(float(top.values[0] - top.values[1]))
        if not torch.allclose(out.logits[0][0].float(), last, atol=1e-4, rtol=1e-4):
            raise RuntimeError("%s: generate's first logits differ from a plain forward" % name)
        if not dynamic:
            # KV-cache consistency: one forward over prompt + greedy[:-1] picks the same ids.
            with torch.no_grad():
                full = m32(out.sequences[:, :-1]).logits[0, len(ids) - 1:]
            if full.argmax(-1).tolist() != greedy:
                raise RuntimeError("%s: cached and uncached greedy differ for %r" % (name, text))
        if min(margins) < MIN_MARGIN:
            rejected.append((text, "min margin %.2e" % min(margins)))
            continue
        valid.append({
            "text": text,
            "ids": ids,
            "last_logits": [f32(v) for v in last.tolist()],
            "last_logits_native": [f32(v) for v in last_nat.tolist()],
            "greedy": greedy,
            "greedy_margins": [f32(v) for v in margins],
            "_std": float(last.std()),
            "_native_diff": float((last_nat - last).abs().max()),
        })
    if len(valid) < 3:
        raise RuntimeError("%s: fewer than 3 usable prompts; rejected %s" % (name, rejected))
    shortest = min(valid, key=lambda p: len(p["ids"]))
    longest = max(valid, key=lambda p: len(p["ids"]))
    keep = [shortest, longest] + [p for p in valid if p is not shortest and p is not longest]
    keep = keep[:4]
    prompts = [p for p in valid if any(p is k for k in keep)]  # candidate order
    lengths = [len(p["ids"]) for p in prompts]
    if min(lengths) > 6 or max(lengths) < 12:
        raise RuntimeError("%s: not enough good prompts: accepted lengths %s, rejected %s"
                           % (name, lengths, rejected))
    if fx.get("require_long_prompt_over_max_pos") and max(lengths) <= cfg["max_position_embeddings"]:
        raise RuntimeError("%s: no prompt longer than max_position_embeddings" % name)
    if fx.get("require_prompt_longer_than_window") and max(lengths) <= cfg["sliding_window"]:
        raise RuntimeError("%s: no prompt longer than sliding_window" % name)

    logit_std = float(np.mean([p.pop("_std") for p in prompts]))
    native_diff = max(p.pop("_native_diff") for p in prompts)
    min_margin = min(min(p["greedy_margins"]) for p in prompts)
    note = ("last_logits and greedy: transformers %s float32 on CPU over the saved weights (%s weights upcast "
            "exactly to float32); compare last_logits at atol 1e-3 + rtol 1e-3 and expect every greedy id "
            "(min margin %.3g). last_logits_native: torch computing in %s on CPU; it differs from last_logits "
            "by up to %.3g here, so compare it at atol %.2g."
            % (transformers.__version__, cfg["torch_dtype"], min_margin, cfg["torch_dtype"], native_diff,
               max(1e-3, 2 * native_diff)))
    if fp8:
        for p in prompts:
            p.pop("last_logits_native")
        note = fp8_fixtures.reference_note(fp8, transformers.__version__, min_margin)
    if want_rope == "longrope":
        note += (" Longrope follows transformers: a forward whose largest position is p uses the long "
                 "factors when p+1 > original_max_position_embeddings, else the short ones, and K already "
                 "in the KV cache keeps the rotation it was computed with.")
    if dynamic and want_rope == "dynamic":
        note += (" Dynamic NTK rope follows transformers: each forward whose largest position is p uses "
                 "base = theta * (factor*(p+1)/max_pos - (factor-1))^(d/(d-2)) when p+1 > max_pos, and K "
                 "already in the KV cache keeps the rotation it was computed with (so a no-cache recompute "
                 "of a long sequence does not reproduce the cached greedy logits).")
    ref = {
        "name": name,
        "torch_dtype": cfg["torch_dtype"],
        "architecture": cfg["architectures"][0],
        "generator": "tools/make_fixtures.py",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__.split("+")[0],
        "tolerance_note": note,
        "stats": {"logit_std": f32(logit_std), "min_greedy_margin": f32(min_margin),
                  "native_max_abs_diff": f32(native_diff), "randomized_norms": n_norm,
                  "randomized_biases": n_bias},
        "prompts": prompts,
    }
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(ref, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    if fp8:
        shutil.rmtree(dense_dir, ignore_errors=True)
    if fx.get("online_fp8"):
        import fp8_fixtures
        fp8_fixtures.write_online_reference(fx, d, prompts, load_kwargs, NEW_TOKENS, f32)
    size = dir_bytes(d)
    if size >= MAX_FIXTURE_BYTES:
        raise RuntimeError("%s: fixture is %d bytes, limit %d" % (name, size, MAX_FIXTURE_BYTES))
    if logit_std < 1.0:
        raise RuntimeError("%s: logit std %.3f < 1; raise initializer_range" % (name, logit_std))
    print("%-24s %-9s logit_std %.3f  min_greedy_margin %.4f  native_max_abs_diff %.3g  prompts %s  "
          "norms %d biases %d  files %s  %.0f KB"
          % (name, cfg["torch_dtype"], logit_std, min_margin, native_diff, lengths, n_norm, n_bias,
             len(os.listdir(d)), size / 1024), flush=True)
    if rejected:
        print("    rejected candidates: %s" % "; ".join("%r (%s)" % r for r in rejected))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                                  "fixtures", "models"))
    ap.add_argument("--only", nargs="*", help="fixture names to build (default: all)")
    args = ap.parse_args(argv)
    try:
        import torch
        import transformers  # noqa: F401
        import tokenizers  # noqa: F401
    except ImportError as e:
        print("make_fixtures: error: %s. Install with: pip install -r tools/requirements-fixtures.txt" % e,
              file=sys.stderr)
        return 1
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    names = {f["name"] for f in FIXTURES}
    for n in args.only or []:
        if n not in names:
            print("make_fixtures: error: unknown fixture %r (known: %s)" % (n, ", ".join(sorted(names))),
                  file=sys.stderr)
            return 1
    os.makedirs(args.out, exist_ok=True)
    for fx in FIXTURES:
        if args.only and fx["name"] not in args.only:
            continue
        try:
            build_fixture(fx, args.out)
        except RuntimeError as e:
            print("make_fixtures: error: %s" % e, file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
