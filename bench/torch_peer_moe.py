"""The mixture-of-experts layer of torch_peer.py (Mixtral, Qwen3-MoE): issue #32's speed peer.

Routing as transformers computes it: softmax over the experts in fp32, top-k, the top-k weights
renormalised (always for Mixtral; when norm_topk_prob for Qwen3-MoE), then cast to the model's
dtype. The experts of a layer are held stacked, w1 (gate) and w3 (up) [E, I, D], w2 (down)
[E, D, I], and run one of two ways, chosen by the traced shape (static under torch.compile):
  gather  T * K < E (decode at small batches): each token's chosen experts' weights are gathered
          (w1[idx], as gpt-fast's Mixtral does) and applied with einsum: reads only the K experts
          of each token, the batch-1 decode bound.
  dense   otherwise: every expert runs on every token, weighted by its routing weight (0 where the
          token did not choose it): reads each expert once, compute E / K times the routed work.
          It is static-shaped, so CUDA graphs hold, and at batch 64 it reads less than gathering
          64 * K experts would.
Prefill over many tokens uses the dense form too (compiled, no CUDA graphs).
"""

import torch
import torch.nn.functional as F
from torch import nn


def moe_config(c, d):
    """Adds the MoE fields of config.json d to torch_peer.Config c (E, K, I, sparse layers)."""
    mt = d["model_type"]
    if mt == "mixtral":
        c.experts, c.top_k = d["num_local_experts"], d["num_experts_per_tok"]
        c.moe_inter, c.norm_topk = d["intermediate_size"], True
        c.sparse = set(range(c.layers))
    elif mt == "qwen3_moe":
        # transformers 5 saves num_experts as num_local_experts
        c.experts, c.top_k = d.get("num_experts", d.get("num_local_experts")), d["num_experts_per_tok"]
        c.moe_inter, c.norm_topk = d["moe_intermediate_size"], bool(d.get("norm_topk_prob", False))
        step, dense_only = d.get("decoder_sparse_step", 1), set(d.get("mlp_only_layers") or [])
        c.sparse = {i for i in range(c.layers) if i not in dense_only and (i + 1) % step == 0}
        c.qk_norm = True
    else:
        raise SystemExit(f"torch_peer.py: model_type {mt} is not llama, mixtral or qwen3_moe")


class MoeFFN(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.k, self.norm_topk = c.top_k, c.norm_topk
        self.gate = nn.Linear(c.dim, c.experts, bias=False)
        self.w1 = nn.Parameter(torch.empty(c.experts, c.moe_inter, c.dim))
        self.w3 = nn.Parameter(torch.empty(c.experts, c.moe_inter, c.dim))
        self.w2 = nn.Parameter(torch.empty(c.experts, c.dim, c.moe_inter))

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])  # [T, D]
        probs = F.softmax(self.gate(x).float(), dim=-1)
        w, idx = torch.topk(probs, self.k, dim=-1)  # [T, K]
        if self.norm_topk:
            w = w / w.sum(dim=-1, keepdim=True)
        w = w.to(x.dtype)
        e = self.w1.shape[0]
        if x.shape[0] * self.k < e:  # gather the chosen experts' weights
            h = F.silu(torch.einsum("td,tkid->tki", x, self.w1[idx])) * torch.einsum(
                "td,tkid->tki", x, self.w3[idx])
            y = torch.einsum("tki,tkdi->tkd", h, self.w2[idx])
            out = torch.einsum("tkd,tk->td", y, w)
        else:  # every expert on every token, weighted (0 where not chosen)
            dense_w = torch.zeros(x.shape[0], e, dtype=x.dtype, device=x.device).scatter(1, idx, w)
            h = F.silu(torch.einsum("td,eid->eti", x, self.w1)) * torch.einsum("td,eid->eti", x, self.w3)
            y = torch.einsum("eti,edi->etd", h, self.w2)
            out = torch.einsum("etd,te->td", y, dense_w)
        return out.reshape(shape)


def moe_state(hf, p, i):
    """The peer's tensors of sparse layer i from the checkpoint dict hf (popped), prefix p: the
    published per-expert names (Mixtral block_sparse_moe.experts.{e}.w1/w2/w3, Qwen3-MoE
    mlp.experts.{e}.gate_proj/up_proj/down_proj) or transformers 5's stacked mlp.experts.gate_up_proj
    [E, 2I, D] / down_proj [E, D, I]."""
    sd = {}
    if p + "block_sparse_moe.gate.weight" in hf:
        m = p + "block_sparse_moe."
        names = ("w1", "w3", "w2")
    else:
        m = p + "mlp."
        names = ("gate_proj", "up_proj", "down_proj")
    sd[f"blocks.{i}.moe.gate.weight"] = hf.pop(m + "gate.weight")
    if m + "experts.gate_up_proj" in hf:
        gu = hf.pop(m + "experts.gate_up_proj")
        sd[f"blocks.{i}.moe.w1"], sd[f"blocks.{i}.moe.w3"] = gu.chunk(2, dim=1)
        sd[f"blocks.{i}.moe.w2"] = hf.pop(m + "experts.down_proj")
        return sd
    e = 0
    stacks = ([], [], [])
    while f"{m}experts.{e}.{names[0]}.weight" in hf:
        for s, n in zip(stacks, names):
            s.append(hf.pop(f"{m}experts.{e}.{n}.weight"))
        e += 1
    if e == 0:
        raise SystemExit(f"torch_peer.py: no experts under {m}experts")
    for s, n in zip(stacks, ("w1", "w3", "w2")):
        sd[f"blocks.{i}.moe.{n}"] = torch.stack(s)
    return sd
