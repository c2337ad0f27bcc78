"""Self-attention over the encoder states: every source position asks its own query of every other.

    layer = SelfAttentionStack(layers=1, heads=4, size=D, dropout=0.3)
    states, weights = layer(states, mask)   # (B, S, D) -> (B, S, D), [(B, heads, S, S) per layer]

One head is the scaled dot-product attention of Vaswani et al. (2017) with the source as its own query:
Q = X W_q, K = X W_k, V = X W_v and softmax(Q K^T / sqrt(d)) V, d = D / heads the key size of a head (the
scale keeps the scores' variance near 1, so the softmax does not saturate as d grows). `heads` such heads read
the states through their own projections; their outputs are joined and projected by W_o.

A block (SelfAttentionBlock) wraps the attention as the Transformer's encoder does (post-norm):
    X' = LayerNorm(X + Dropout(SelfAttention(X)))
and padding rows are set back to zero, as the encoder's states are. The blocks sit after the encoder's LSTM
(nmt.encoder.Encoder), so the LSTM gives the positions their order: the attention alone has none (permuting the
positions permutes its outputs). Keys on padding get -inf before the softmax (in fp32): exactly zero weight.

Shapes: B batch, S source positions (query and key positions alike), D state size, N heads, K = D / N.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from nmt.dropout import Dropout


class SelfAttention(nn.Module):
    """Masked multi-head scaled dot-product attention, in the attention family's interface:
    forward(query, keys, values, mask) -> (context, weights); for self-attention all three are the states.

    Projections with biases (as torch.nn.MultiheadAttention: its weights can be copied in), Xavier-uniform.
    `weights` are per head, (B, N, T, S): each row sums to 1 over real source positions.
    """

    def __init__(self, size: int, heads: int):
        super().__init__()
        if heads < 1 or size % heads:
            raise ValueError(
                f"model.self_attention_heads={heads} must be at least 1 and divide the encoder state size {size}"
            )
        self.size, self.heads, self.head_size = size, heads, size // heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(size, size) for _ in range(4))
        for proj in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            nn.init.xavier_uniform_(proj.weight)
            nn.init.zeros_(proj.bias)

    def _split(self, x: Tensor) -> Tensor:
        B, L, _ = x.shape
        return x.view(B, L, self.heads, self.head_size).transpose(1, 2)  # (B, N, L, K)

    def forward(self, query: Tensor, keys: Tensor, values: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """query (B, T, D), keys and values (B, S, D), mask (B, S) True on real positions
        -> context (B, T, D), weights (B, N, T, S) fp32."""
        B, T, _ = query.shape
        q = self._split(self.q_proj(query))  # (B, N, T, K)
        k = self._split(self.k_proj(keys))  # (B, N, S, K)
        v = self._split(self.v_proj(values))  # (B, N, S, K)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_size)  # (B, N, T, S)
        scores = scores.float().masked_fill(~mask[:, None, None, :], float("-inf"))
        weights = torch.softmax(scores, dim=-1)  # (B, N, T, S) fp32
        heads_out = torch.matmul(weights.to(v.dtype), v)  # (B, N, T, K)
        context = self.out_proj(heads_out.transpose(1, 2).reshape(B, T, self.size))  # (B, T, D)
        return context, weights


class SelfAttentionBlock(nn.Module):
    """LayerNorm(X + Dropout(SelfAttention(X, X, X))), zero again on padding."""

    def __init__(self, size: int, heads: int, dropout: float):
        super().__init__()
        self.attention = SelfAttention(size, heads)
        self.dropout = Dropout(dropout)
        self.norm = nn.LayerNorm(size)

    def forward(self, states: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """states (B, S, D), mask (B, S) -> (states (B, S, D), weights (B, N, S, S))."""
        context, weights = self.attention(states, states, states, mask)
        out = self.norm(states + self.dropout(context))  # (B, S, D)
        return out * mask[:, :, None].to(out.dtype), weights


class SelfAttentionStack(nn.Module):
    """`layers` SelfAttentionBlocks, one after another."""

    def __init__(self, layers: int, heads: int, size: int, dropout: float):
        super().__init__()
        self.blocks = nn.ModuleList(SelfAttentionBlock(size, heads, dropout) for _ in range(layers))

    def forward(self, states: Tensor, mask: Tensor) -> tuple[Tensor, list[Tensor]]:
        """states (B, S, D), mask (B, S) -> (states (B, S, D), every layer's weights [(B, N, S, S), ...])."""
        weights = []
        for block in self.blocks:
            states, w = block(states, mask)
            weights.append(w)
        return states, weights
