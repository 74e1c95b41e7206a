"""The layers of the hybrid Qwen3.5 family in torch (families/qwen3_5.py), written as step functions
over explicit state tensors so an exporter can follow them op for op:

- Gated DeltaNet (`GatedDeltaNet`): in_proj_qkv -> causal depthwise conv (kernel K, its state = the
  last K-1 inputs) + SiLU -> q, k (L2-normalised, q scaled by 1/sqrt(Dk); each key head serves
  Hv/Hk value heads), v -> the gated delta rule over a recurrent state S [Hv, Dk, Dv]:
      S_t = a_t S_{t-1} + k_t u_t^T,   u_t = b_t (v_t - a_t S_{t-1}^T k_t),   o_t = S_t^T q_t
  with decay a_t = exp(g_t), g_t = -exp(A_log) softplus(in_proj_a x_t + dt_bias), and
  b_t = sigmoid(in_proj_b x_t) -> RMSNorm(o) * SiLU(in_proj_z x) -> out_proj. Prefill runs it
  chunk by chunk (`delta_rule_chunked`, below), decode and verify token by token
  (`delta_rule_steps`), which also yields the state after every position: what a speculative verify
  needs to roll back to a partial accept (`rollback`). The exported graph reaches the same states
  without storing one per token (export/hybrid_target.py: carried rows + the count kept).
- Gated full attention (`GatedAttention`): q_proj yields per head [query | output gate];
  zero-centred RMSNorm on q and k per head; RoPE on the first `rotary_dim` dims only;
  output * sigmoid(gate) -> o_proj.
- Zero-centred RMSNorm (`CentredRMSNorm`: x * (1 + w)) everywhere but the linear layers' gated norm.

The chunked rule, derived for one chunk of L tokens starting from S0, with G_t = g_1 + .. + g_t:
    S_t = e^{G_t} S0 + sum_{s<=t} e^{G_t - G_s} k_s u_s^T
    (I + A) U = b * (V - e^G K S0)     (a unit-lower solve)
    A[t, s] = b_t e^{G_t - G_s} k_t.k_s  (s < t)
    O = e^G Q S0 + (Q K^T * e^{G_t - G_s}, s <= t) U,     S_L = e^{G_L} S0 + (e^{G_L - G} K)^T U

>>> model = HybridModel(cfg); state = model.new_state(max_len=64)              # doctest: +SKIP
>>> logits, state = model.step(ids, start=0, state=state)                        # doctest: +SKIP
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .checkpoint import Checkpoint, check_shapes
from .config import LINEAR, TargetConfig
from .families import family
from .layers import MLP, RotaryTable


class CentredRMSNorm(nn.Module):
    """RMSNorm whose weight is stored zero-centred: x / rms(x) * (1 + w), in float32."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).to(x.dtype)


# ---------------------------------------------------------------- the gated delta rule
def delta_rule_steps(q, k, v, g, beta, state):
    """Token by token: (outputs [T, Hv, Dv], states after each token [T, Hv, Dk, Dv]).

    q, k [T, Hv, Dk] (normalised, q scaled), v [T, Hv, Dv], g, beta [T, Hv], state [Hv, Dk, Dv].
    """
    outs, states = [], []
    for t in range(q.shape[0]):
        state = state * g[t].exp()[:, None, None]  # decay
        read = torch.einsum("hkv,hk->hv", state, k[t])  # [Hv, Dv]: what S recalls
        state = state + k[t][:, :, None] * (beta[t][:, None] * (v[t] - read))[:, None, :]
        outs.append(torch.einsum("hkv,hk->hv", state, q[t]))
        states.append(state)
    return torch.stack(outs), torch.stack(states)


CHUNK = 64  # positions per chunk of `delta_rule_chunked`


def delta_rule_chunked(q, k, v, g, beta, state):
    """Chunk by chunk (CHUNK positions; the derivation in the module docstring): (outputs
    [T, Hv, Dv], final state [Hv, Dk, Dv])."""
    chunk, outs = CHUNK, []
    for lo in range(0, q.shape[0], chunk):
        qc, kc, vc = (x[lo : lo + chunk].transpose(0, 1) for x in (q, k, v))  # [Hv, L, D]
        gc, bc = g[lo : lo + chunk].T, beta[lo : lo + chunk].T  # [Hv, L]
        size = gc.shape[1]
        cum = gc.cumsum(-1)  # [Hv, L]: G_t
        below = torch.ones(size, size, dtype=torch.bool).tril()  # s <= t
        gap = (cum[:, :, None] - cum[:, None, :]).masked_fill(~below, -math.inf).exp()  # [Hv, L, L]
        lower = (
            bc[:, :, None] * (kc @ kc.transpose(1, 2)) * gap * ~torch.eye(size, dtype=torch.bool)
        )
        rhs = bc[:, :, None] * (vc - cum.exp()[:, :, None] * (kc @ state))  # [Hv, L, Dv]
        eye = torch.eye(size).expand_as(lower)
        u = torch.linalg.solve_triangular(eye + lower, rhs, upper=False, unitriangular=True)
        outs.append(cum.exp()[:, :, None] * (qc @ state) + ((qc @ kc.transpose(1, 2)) * gap) @ u)
        tail = (cum[:, -1:] - cum).exp()[:, :, None]  # [Hv, L, 1]: e^{G_L - G_s}
        state = cum[:, -1].exp()[:, None, None] * state + (tail * kc).transpose(1, 2) @ u
    return torch.cat(outs, dim=1).transpose(0, 1), state  # [T, Hv, Dv]


# ---------------------------------------------------------------- Gated DeltaNet
class GatedDeltaNet(nn.Module):
    """One linear-attention layer (published names: `linear_attn.*`)."""

    def __init__(self, cfg: TargetConfig):
        super().__init__()
        self.cfg = cfg
        h, hv = cfg.hidden_size, cfg.linear_num_value_heads
        self.in_proj_qkv = nn.Linear(h, cfg.conv_dim, bias=False)
        self.in_proj_z = nn.Linear(h, cfg.value_dim, bias=False)
        self.in_proj_b = nn.Linear(h, hv, bias=False)
        self.in_proj_a = nn.Linear(h, hv, bias=False)
        self.conv1d = nn.Conv1d(
            cfg.conv_dim, cfg.conv_dim, cfg.linear_conv_kernel_dim, groups=cfg.conv_dim, bias=False
        )
        self.dt_bias = nn.Parameter(torch.ones(hv))
        self.A_log = nn.Parameter(torch.zeros(hv))
        self.norm = nn.Module()
        self.norm.weight = nn.Parameter(torch.ones(cfg.linear_value_head_dim))
        self.out_proj = nn.Linear(cfg.value_dim, h, bias=False)

    def conv(self, x: torch.Tensor, conv_state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Causal depthwise conv + SiLU of x [T, C] after the state [C, K-1]: (y [T, C], states
        after each token [T, C, K-1])."""
        seq = torch.cat([conv_state, x.T], dim=1)  # [C, K-1+T]
        y = F.conv1d(seq[None], self.conv1d.weight, groups=seq.shape[0])[0]  # [C, T]
        keep = conv_state.shape[1]
        states = seq.unfold(1, keep, 1)[:, 1:].transpose(0, 1)  # [T, C, K-1]
        return F.silu(y.T), states

    def forward(
        self,
        x: torch.Tensor,
        conv_state: torch.Tensor,
        rec_state: torch.Tensor,
        per_position: bool = False,
    ):
        """x [T, H] after the states (conv [C, K-1], recurrent [Hv, Dk, Dv]) -> (out [T, H], conv
        states, recurrent states): after every token ([T, ...]) with `per_position` (token by
        token), else after the last ([1, ...], chunked)."""
        c = self.cfg
        num = x.shape[0]
        mixed, conv_states = self.conv(self.in_proj_qkv(x), conv_state)  # [T, C]
        kd = c.linear_num_key_heads * c.linear_key_head_dim
        q, k, v = mixed.split([kd, kd, c.value_dim], dim=-1)
        group = c.linear_num_value_heads // c.linear_num_key_heads  # value heads per key head
        # [T, Hv, Dk]
        q, k = (
            _l2norm(t.reshape(num, -1, c.linear_key_head_dim).float()).repeat_interleave(
                group, dim=1
            )
            for t in (q, k)
        )
        q = q / math.sqrt(c.linear_key_head_dim)
        v = v.reshape(num, -1, c.linear_value_head_dim).float()  # [T, Hv, Dv]
        beta = torch.sigmoid(self.in_proj_b(x).float())  # [T, Hv]
        g = -self.A_log.float().exp() * F.softplus(self.in_proj_a(x).float() + self.dt_bias)
        if per_position:
            o, rec_states = delta_rule_steps(q, k, v, g, beta, rec_state.float())
        else:
            o, last = delta_rule_chunked(q, k, v, g, beta, rec_state.float())
            rec_states, conv_states = last[None], conv_states[-1:]
        z = self.in_proj_z(x).reshape(num, -1, c.linear_value_head_dim)  # [T, Hv, Dv]
        normed = (
            o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + c.rms_norm_eps) * self.norm.weight
        )
        out = (normed * F.silu(z.float())).reshape(num, -1).to(x.dtype)  # [T, Hv*Dv]
        return self.out_proj(out), conv_states, rec_states


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(|x|^2 + 1e-6) over the last axis (the published kernels' form, not F.normalize's
    max(|x|, eps))."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + 1e-6)


# ---------------------------------------------------------------- gated full attention
class GatedAttention(nn.Module):
    """One full-attention layer (published names: `self_attn.*`), over an explicit K/V prefix."""

    def __init__(self, cfg: TargetConfig):
        super().__init__()
        self.cfg = cfg
        h, d, hq, hkv = (
            cfg.hidden_size,
            cfg.head_dim,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
        )
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(h, 2 * hq * d, bias=bias)
        self.k_proj = nn.Linear(h, hkv * d, bias=bias)
        self.v_proj = nn.Linear(h, hkv * d, bias=bias)
        self.o_proj = nn.Linear(hq * d, h, bias=bias)
        self.q_norm = CentredRMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = CentredRMSNorm(d, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, past_k, past_v):
        """x [T, H] at rows cos/sin [T, R] after past K/V [Hkv, S, D] -> (out [T, H], new K, new V
        [Hkv, T, D])."""
        c, num = self.cfg, x.shape[0]
        # [T, Hq, 2D]: query | gate
        qg = self.q_proj(x).reshape(num, c.num_attention_heads, 2 * c.head_dim)
        q, gate = qg.split(c.head_dim, dim=-1)
        q = _partial_rope(self.q_norm(q).transpose(0, 1), cos, sin)  # [Hq, T, D]
        k = _partial_rope(
            self.k_norm(self.k_proj(x).reshape(num, -1, c.head_dim)).transpose(0, 1), cos, sin
        )
        v = self.v_proj(x).reshape(num, -1, c.head_dim).transpose(0, 1)  # [Hkv, T, D]
        keys, values = torch.cat([past_k, k], 1), torch.cat([past_v, v], 1)  # [Hkv, S+T, D]
        rep = c.num_attention_heads // c.num_key_value_heads
        # [Hq, S+T, D]
        keys, values = (
            keys.repeat_interleave(rep, 0),
            values.repeat_interleave(rep, 0),
        )
        scores = q @ keys.transpose(1, 2) / math.sqrt(c.head_dim)  # [Hq, T, S+T]
        past = past_k.shape[1]
        # causal [T, S+T]
        seen = torch.arange(past + num)[None, :] <= (past + torch.arange(num))[:, None]
        scores = scores.masked_fill(~seen, -math.inf)
        out = torch.softmax(scores.float(), -1).to(values.dtype) @ values  # [Hq, T, D]
        out = out.transpose(0, 1).reshape(num, -1) * torch.sigmoid(gate.reshape(num, -1))
        return self.o_proj(out), k, v


def _partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on the first R dims of x [h, T, D] (cos/sin [T, R]); the rest pass
    through."""
    r = cos.shape[-1]
    rot, rest = x[..., :r], x[..., r:]
    turned = torch.cat([-rot[..., r // 2 :], rot[..., : r // 2]], dim=-1)
    return torch.cat([rot * cos + turned * sin, rest], dim=-1)


# ---------------------------------------------------------------- the model and its state
@dataclass
class HybridState:
    """Everything a hybrid target carries between steps: per full layer K/V [Hkv, S, D] (S =
    `length`), per linear layer the conv state [C, K-1] and the recurrent state [Hv, Dk, Dv] (fixed
    size). Layer i's entry is None where the layer is of the other kind."""

    keys: list
    values: list
    conv: list
    rec: list
    length: int = 0


class HybridLayer(nn.Module):
    def __init__(self, cfg: TargetConfig, kind: str):
        super().__init__()
        self.kind = kind
        self.input_layernorm = CentredRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if kind == LINEAR:
            self.linear_attn = GatedDeltaNet(cfg)
        else:
            self.self_attn = GatedAttention(cfg)
        self.post_attention_layernorm = CentredRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)


class HybridModel(nn.Module):
    """The Qwen3.5 text model + LM head as one pure `step` over a HybridState (names: published,
    unprefixed)."""

    def __init__(self, cfg: TargetConfig):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(HybridLayer(cfg, kind) for kind in cfg.layer_types)
        self.norm = CentredRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rope = RotaryTable(
            cfg.rotary_dim, cfg.rope_theta, cfg.rope_scaling, cfg.max_position_embeddings
        )

    def new_state(self) -> HybridState:
        """The state before the first token: empty K/V, zero conv and recurrent states."""
        c = self.config
        kv = lambda: torch.zeros(c.num_key_value_heads, 0, c.head_dim)  # noqa: E731
        linear = [kind == LINEAR for kind in c.layer_types]
        return HybridState(
            keys=[None if lin else kv() for lin in linear],
            values=[None if lin else kv() for lin in linear],
            conv=[
                torch.zeros(c.conv_dim, c.linear_conv_kernel_dim - 1) if lin else None
                for lin in linear
            ],
            rec=[
                torch.zeros(
                    c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim
                )
                if lin
                else None
                for lin in linear
            ],
        )

    def step(self, ids: torch.Tensor, state: HybridState, per_position: bool = False):
        """Tokens `ids` [T] placed after `state` -> (logits [T, V], state after the last token,
        per-position states).

        Per-position states (`per_position`: the linear layers run token by token) are `rollback`'s
        input: the conv / recurrent states after each of the T tokens; without it they are None and
        prefill runs chunked."""
        start, num = state.length, ids.shape[0]
        cos, sin = self.rope(torch.arange(start, start + num))  # [T, R]
        x = self.embed_tokens(ids)  # [T, H]
        new = HybridState(
            list(state.keys), list(state.values), list(state.conv), list(state.rec), start + num
        )
        trail = (
            HybridState(
                [None] * len(self.layers),
                [None] * len(self.layers),
                list(state.conv),
                list(state.rec),
                start,
            )
            if per_position
            else None
        )
        for i, layer in enumerate(self.layers):
            h = layer.input_layernorm(x)
            if layer.kind == LINEAR:
                h, convs, recs = layer.linear_attn(h, state.conv[i], state.rec[i], per_position)
                new.conv[i], new.rec[i] = convs[-1], recs[-1]
                if trail is not None:
                    trail.conv[i], trail.rec[i] = convs, recs  # [T, ...] each
            else:
                h, k, v = layer.self_attn(h, cos, sin, state.keys[i], state.values[i])
                new.keys[i], new.values[i] = (
                    torch.cat([state.keys[i], k], 1),
                    torch.cat([state.values[i], v], 1),
                )
            x = x + h
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.lm_head(self.norm(x)), new, trail


def rollback(after: HybridState, trail: HybridState, kept: int) -> HybridState:
    """The state after the first `kept` of a verify's tokens (1 <= kept <= T), from the state after
    all of them (`after`) and the per-position states of that verify (`trail`): K/V are cut (a
    pointer move in a runtime); the conv / recurrent states are the ones stored for token kept-1 (no
    re-run)."""
    verified = after.length - trail.length
    if not 1 <= kept <= verified:
        raise ValueError(f"kept={kept}: a verify of {verified} tokens keeps 1..{verified} of them")
    length = trail.length + kept
    cut = [None if k is None else k[:, :length] for k in after.keys]
    return HybridState(
        cut,
        [None if v is None else v[:, :length] for v in after.values],
        [None if c is None else c[kept - 1] for c in trail.conv],
        [None if r is None else r[kept - 1] for r in trail.rec],
        length,
    )


def load_hybrid(path, cfg: TargetConfig | None = None, ckpt=None) -> HybridModel:
    """A HybridModel with the weights of a published Qwen3.5 checkpoint folder (the vision tower is
    not read); `ckpt`: an opened checkpoint of it to read instead (parity: the bundle's weights)."""

    cfg = cfg or TargetConfig.from_json(path)  # a qwen3_5 config.json gives its HybridConfig
    ckpt = ckpt or Checkpoint.open(path)
    names = family(cfg.model_type).tensors(cfg)
    check_shapes(
        names,
        ckpt,
        ignore=tuple(
            n
            for n in ckpt.names()
            if not n.startswith(cfg.weight_prefix + ".") and n != "lm_head.weight"
        ),
    )
    model = HybridModel(cfg)
    state = {}
    for name in names:
        local = name if name == "lm_head.weight" else name.removeprefix(cfg.weight_prefix + ".")
        state[local] = torch.from_numpy(ckpt.array(name).astype("float32"))
    if cfg.tie_word_embeddings:
        state["lm_head.weight"] = state["embed_tokens.weight"]
    model.load_state_dict(state)
    return model.eval()
