"""FP8 variants of the make_fixtures.py checkpoints (issue #35), used by make_fixtures.py.

transformers' FineGrainedFP8Config quantizes only on a GPU, so the FP8 tensors are written here with
torch.float8_e4m3fn, in exactly the layouts the loaders read:

  "fp8" (HF, transformers' integrations/finegrained_fp8.py Fp8Quantize): every decoder-layer
      projection `X.weight` [out, in] becomes float8_e4m3fn with `X.weight_scale_inv` (float32)
      [out / b0, in / b1]: per block, s = 448 / max|W| (1 for a zero block), q = e4m3(clamp(W * s)),
      weight_scale_inv = 1 / s. config.json gets {"quant_method": "fp8", "activation_scheme":
      "dynamic", "weight_block_size": [b0, b1], "fmt": "e4m3"}. transformers loads it on CPU itself
      (it dequantizes a pre-quantized FP8 checkpoint when there is no GPU: q x weight_scale_inv in
      float32), so the reference IS transformers running that checkpoint, dequantized.
  "compressed-tensors" (llm-compressor's FP8_DYNAMIC: per-channel weights, dynamic per-token
      activations): `X.weight` float8_e4m3fn with `X.weight_scale` [out, 1] float32, s = max_c |W| / 448,
      q = e4m3(clamp(W / s)); quantization_config as llm-compressor writes it. Loading it in transformers
      needs the compressed-tensors package, which also fake-quantizes activations; the reference is
      instead transformers (float32) over the dequantized weights (q x s), written to a temporary
      folder: it states the weight path only, as Tessera's CPU backend computes (fp32 activations).

write_online_reference(): the reference of `model.quantization = "fp8"` for a dense fixture: every projection
quantized per output channel as in compressed-tensors above (s = max_c |W| / 448, 1 for a zero row),
dequantized, run by transformers in float32.
"""

import json
import os

import torch

FP8_MAX = 448.0
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
               "qkv_proj", "gate_up_proj")


def is_projection(name):
    parts = name.split(".")
    return name.startswith("model.layers.") and name.endswith(".weight") and len(parts) >= 2 \
        and parts[-2] in PROJECTIONS


def quantize_block(w, b0, b1):
    """HF fp8: (q float8_e4m3fn [out, in], weight_scale_inv float32 [out/b0, in/b1])."""
    rows, cols = w.shape
    if rows % b0 or cols % b1:
        raise RuntimeError("weight %s is not a multiple of the block %dx%d" % (list(w.shape), b0, b1))
    t = w.float().reshape(rows // b0, b0, cols // b1, b1)
    max_abs = t.abs().amax(dim=(1, 3))
    scales = torch.where(max_abs > 0, FP8_MAX / max_abs.clamp(min=1e-12), torch.ones_like(max_abs))
    q = (t * scales[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.reshape(rows, cols), (1.0 / scales).to(torch.float32)


def quantize_channel(w):
    """Per output channel: (q float8_e4m3fn [out, in], scale float32 [out, 1])."""
    wf = w.float()
    max_abs = wf.abs().amax(dim=1, keepdim=True)
    scale = torch.where(max_abs > 0, max_abs / FP8_MAX, torch.ones_like(max_abs))
    q = (wf / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale.to(torch.float32)


def dequantize_channel(w):
    q, s = quantize_channel(w)
    return q.float() * s


def _ct_config(ignore):
    return {
        "quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
        "global_compression_ratio": None, "ignore": ignore, "kv_cache_scheme": None, "sparsity_config": {},
        "config_groups": {"group_0": {
            "targets": ["Linear"], "output_activations": None,
            "weights": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel",
                        "dynamic": False, "group_size": None, "block_structure": None, "observer": "minmax",
                        "actorder": None, "observer_kwargs": {}},
            "input_activations": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token",
                                  "dynamic": True, "group_size": None, "block_structure": None,
                                  "observer": None, "actorder": None, "observer_kwargs": {}},
        }},
    }


def quantize_checkpoint(d, spec, dense_out):
    """Rewrites d/model.safetensors and d/config.json into the FP8 format `spec` names. Writes the
    dequantized dense checkpoint (float32 projections, other tensors as saved) to `dense_out`.
    Returns the number of quantized tensors."""
    from safetensors.torch import load_file, save_file
    src = os.path.join(d, "model.safetensors")
    tensors = load_file(src)
    out, dense = {}, {}
    n = 0
    for name, w in sorted(tensors.items()):
        if not is_projection(name):
            out[name] = w
            dense[name] = w.float()
            continue
        n += 1
        if spec["format"] == "fp8":
            b0, b1 = spec["block"]
            q, inv = quantize_block(w, b0, b1)
            out[name] = q
            out[name + "_scale_inv"] = inv
            rows, cols = w.shape
            deq = (q.float().reshape(rows // b0, b0, cols // b1, b1) * inv[:, None, :, None]).reshape(rows, cols)
        else:
            q, s = quantize_channel(w)
            out[name] = q
            out[name + "_scale"] = s
            deq = q.float() * s
        dense[name] = deq
    save_file(out, src, metadata={"format": "pt"})
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    if spec["format"] == "fp8":
        cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                                      "weight_block_size": list(spec["block"])}
    else:
        cfg["quantization_config"] = _ct_config(["lm_head"])
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    os.makedirs(dense_out, exist_ok=True)
    for f in os.listdir(d):
        if f.startswith("tokenizer"):
            with open(os.path.join(d, f), "rb") as a, open(os.path.join(dense_out, f), "wb") as b:
                b.write(a.read())
    dense_cfg = dict(cfg)
    dense_cfg.pop("quantization_config")
    dense_cfg["torch_dtype"] = "float32"
    with open(os.path.join(dense_out, "config.json"), "w") as f:
        json.dump(dense_cfg, f, indent=2)
    save_file({k: v.contiguous() for k, v in dense.items()}, os.path.join(dense_out, "model.safetensors"),
              metadata={"format": "pt"})
    return n


def quantize_model_online(model):
    """Per-output-channel quantize-dequantize of every projection of `model` (float32), in place."""
    n = 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if is_projection(name):
                p.copy_(dequantize_channel(p.data.float()))
                n += 1
    return n


def prompt_references(model, prompts, new_tokens, f32):
    """last_logits, greedy ids and margins of `model` for each prompt's ids (dicts with "text", "ids")."""
    from transformers import GenerationConfig
    gen = GenerationConfig(do_sample=False, min_new_tokens=new_tokens, max_new_tokens=new_tokens,
                           use_cache=True, eos_token_id=None, pad_token_id=0, return_dict_in_generate=True,
                           output_logits=True)
    model.generation_config.eos_token_id = None
    out_prompts = []
    for p in prompts:
        x = torch.tensor([p["ids"]])
        with torch.no_grad():
            last = model(x).logits[0, -1].float()
            out = model.generate(x, attention_mask=torch.ones_like(x), generation_config=gen)
        greedy = out.sequences[0, len(p["ids"]):].tolist()
        margins = []
        for lg in out.logits:
            top = torch.topk(lg[0].float(), 2)
            margins.append(float(top.values[0] - top.values[1]))
        out_prompts.append({"text": p["text"], "ids": p["ids"], "last_logits": [f32(v) for v in last.tolist()],
                            "greedy": greedy, "greedy_margins": [f32(v) for v in margins]})
    return out_prompts


def reference_note(fp8, version, min_margin):
    """reference.json's tolerance_note of an FP8 fixture."""
    if fp8["format"] == "fp8":
        return ("HF fp8 checkpoint (float8_e4m3fn projections, weight_scale_inv per %dx%d block). last_logits "
                "and greedy: transformers %s loading this checkpoint on CPU, which dequantizes it (q x "
                "weight_scale_inv in float32) and computes in float32; compare last_logits at atol 1e-3 + "
                "rtol 1e-3 and expect every greedy id (min margin %.3g)."
                % (fp8["block"][0], fp8["block"][1], version, min_margin))
    return ("compressed-tensors FP8 checkpoint (float8_e4m3fn projections, per-channel weight_scale, "
            "dynamic per-token activations). last_logits and greedy: transformers %s float32 on CPU over "
            "the dequantized weights (q x weight_scale; transformers needs the compressed-tensors package "
            "for this format, which would also fake-quantize activations: the reference, like Tessera's "
            "CPU backend, keeps activations in float32); compare last_logits at atol 1e-3 + rtol 1e-3 and "
            "expect every greedy id (min margin %.3g)." % (version, min_margin))


def write_online_reference(fx, d, prompts, load_kwargs, new_tokens, f32):
    """reference_online_fp8.json: model.quantization = "fp8" (see the module docstring)."""
    import transformers
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, **load_kwargs)
    m.eval()
    n = quantize_model_online(m)
    refs = prompt_references(m, prompts, new_tokens, f32)
    margin = min(min(p["greedy_margins"]) for p in refs)
    ref = {
        "name": fx["name"] + " with model.quantization = fp8",
        "torch_dtype": fx["config"]["torch_dtype"],
        "generator": "tools/make_fixtures.py (tools/fp8_fixtures.py)",
        "transformers_version": transformers.__version__,
        "tolerance_note": ("Online FP8: the %d projections quantized per output channel (s = max|row| / 448, "
                           "1 for a zero row; q = e4m3(W / s)) and dequantized (q x s), then transformers float32 on "
                           "CPU; activations stay float32 as on Tessera's CPU backend. Compare last_logits at atol "
                           "1e-3 + rtol 1e-3 and expect every greedy id (min margin %.3g)." % (n, margin)),
        "stats": {"min_greedy_margin": f32(margin), "quantized_tensors": n},
        "prompts": refs,
    }
    with open(os.path.join(d, "reference_online_fp8.json"), "w") as f:
        json.dump(ref, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
