"""The torch reference of a sparse mixture-of-experts MLP (qwen3_moe), as transformers computes it.

Router: logits = x @ gate^T, softmax in float32 over all experts, the top-k probabilities kept
(renormalised to sum 1 when `norm_topk_prob`); output = sum over the chosen experts of weight *
SwiGLU expert(x). Each expert is the dense layers.MLP, so its tensors load under the published names
`mlp.experts.E.{gate,up,down}_proj.weight`.

>>> moe = SparseMoE(MoESpec(32, 8, 2, 16, True))                     # doctest: +SKIP
>>> moe(torch.randn(1, 5, 32)).shape                                # doctest: +SKIP
torch.Size([1, 5, 32])
"""

from __future__ import annotations

import torch
from torch import nn

from .layers import MLP
from .spec import MoESpec


class SparseMoE(nn.Module):
    def __init__(self, m: MoESpec):
        super().__init__()
        self.m = m
        self.gate = nn.Linear(m.hidden_size, m.num_experts, bias=False)
        self.experts = nn.ModuleList(
            MLP(m.hidden_size, m.intermediate) for _ in range(m.num_experts)
        )

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [N, k] in x's dtype, expert ids [N, k]) for tokens x [N, H]."""
        probs = torch.softmax(self.gate(x).float(), dim=-1)  # [N, E]
        weights, ids = torch.topk(probs, self.m.top_k, dim=-1)  # [N, k] each
        if self.m.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), ids

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])  # [N, H]
        weights, ids = self.route(flat)
        out = torch.zeros_like(flat)
        for e in ids.unique().tolist():  # each chosen expert once, on the tokens that chose it
            tokens, slot = torch.where(ids == e)
            y = self.experts[e](flat[tokens]) * weights[tokens, slot, None]  # [n_e, H]
            out.index_add_(0, tokens, y)
        return out.view(x.shape)  # [b, T, H]
