"""The attention family: one class per scoring function behind one interface.

Every attention is used the same way by the decoder:

    keys, values = attention.prepare(states, summary)       # once per sentence
    keys, values = attention.for_steps(keys, values, dtype)  # training, when called once per decoder step
    context, weights = attention(query, keys, values, mask)  # every decoder step (or all steps at once)

Shapes (one alphabet everywhere): B batch, S source length, T target steps, Q query size,
D encoder state size (2 x hidden for a biLSTM), A attention size.

    query   (B, T, Q)   decoder state(s) asking where to look
    states  (B, S, D)   encoder outputs;  summary (B, D) the encoder's fixed sentence vector
    mask    (B, S)      True on real source tokens, False on padding
    context (B, T, D)   what the decoder reads;  weights (B, T, S) sums to 1 over real tokens

Masking happens in fp32 (-inf before the softmax), so padding gets exactly zero weight even under
bf16 autocast. Keys that do not depend on the query (W_h h) are projected once in `prepare`, returned,
and passed back in: no per-batch state is ever stored on a module. The products of a query or weights with
keys and values run in the dtype those are held in (nmt.device.step_dtype: fp32 on a CPU), autocast off.
`for_steps` wraps them for a training loop that calls the attention once per step (nmt.kernels.stepweight.StepMatrix,
nmt.kernels.energy.StepKeys), so that their gradients are summed once over the steps rather than formed in full at
every step.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from nmt.choices import LuongScore, choice
from nmt.device import autocast_dtype
from nmt.kernels.additive_step import additive_step, factored_keys
from nmt.kernels.energy import StepKeys, additive_energy
from nmt.kernels.stepweight import StepMatrix, StepWeight, bmm
from nmt.shapes import linear_rows


def masked_softmax(scores: Tensor, mask: Tensor) -> Tensor:
    """Softmax over the last axis of `scores` (B, T, S) with ~mask (B, S) set to -inf, in fp32."""
    scores = scores.float().masked_fill(~mask[:, None, :], float("-inf"))
    return torch.softmax(scores, dim=-1)


class Attention(nn.Module):
    """Base class: `prepare` projects what does not depend on the query; `forward` scores and reads."""

    has_alignment = True  # False for "none": its context looks at no position
    reads_query = True  # False for "none": the context is the same at every step, whatever the query

    def __init__(self, query_dim: int, value_dim: int):
        super().__init__()
        self.query_dim, self.value_dim = query_dim, value_dim

    def prepare(self, states: Tensor, summary: Tensor) -> tuple[Tensor, Tensor]:
        """(keys, values) for this batch of sentences; by default the states themselves."""
        return states, states

    def for_steps(self, keys: Tensor, values: Tensor, dtype: torch.dtype | None) -> tuple:
        """(keys, values) for a training loop that calls `forward` once per decoder step, held in `dtype`
        (nmt.device.step_dtype; None: as they are): the values' gradient is then one bmm over all steps
        (StepMatrix); subclasses that score with a matmul or the additive energy hand their keys over too."""
        return keys, StepMatrix.of(values, dtype)

    def additive_v(self) -> Tensor | None:
        """v (A,) where a step is exactly the additive score v^T tanh(W_s s + W_h h) over `for_steps`' keys
        (AdditiveAttention), for RNNsearch's loop as one node (nmt.kernels.decoder_loop); None elsewhere."""
        return None

    def forward(self, query: Tensor, keys: Tensor, values: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        weights = masked_softmax(self.score(query, keys), mask)  # (B, T, S) fp32
        context = bmm(weights, values)  # (B, T, D)
        return context, weights

    def score(self, query: Tensor, keys: Tensor) -> Tensor:
        """Unnormalised scores (B, T, S)."""
        raise NotImplementedError


class NoAttention(Attention):
    """The fixed-vector baseline (RNNencdec): the context is the encoder's sentence vector at every step.

    It never looks at source positions, so permuting the encoder states leaves it unchanged.
    Its weights are all zero: there is no alignment to show.
    """

    has_alignment = False
    reads_query = False

    def prepare(self, states: Tensor, summary: Tensor) -> tuple[Tensor, Tensor]:
        vector = summary[:, None, :]  # (B, 1, D)
        return vector, vector

    def for_steps(self, keys: Tensor, values: Tensor, dtype: torch.dtype | None) -> tuple[Tensor, Tensor]:
        return keys, values  # the vector is expanded, not multiplied: autograd's sum is already one addition

    def forward(self, query: Tensor, keys: Tensor, values: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        B, T, S = query.size(0), query.size(1), mask.size(1)
        context = values.expand(B, T, values.size(-1))  # (B, T, D): the same vector for every step
        return context, query.new_zeros(B, T, S, dtype=torch.float32)


class AdditiveAttention(Attention):
    """Bahdanau et al. (2015): score(s, h) = v^T tanh(W_s s + W_h h).

    The energy is computed by nmt.kernels.energy in cache-sized pieces, in fp32, with a backward that recomputes
    the tanh: the (B, T, S, A) tensor of the plain form is never built. Where the compiled kernels run, a
    decoder step (one query) is two C++ kernels instead, the softmax and the values included
    (nmt.kernels.additive_step).

    Which decoder state is the query (the previous state s_{t-1}, as in the paper, or the current
    top state h_t, as in Luong's ordering) is chosen by the decoder (`attention.query`).
    """

    def __init__(self, query_dim: int, value_dim: int, hidden_size: int | None = None):
        super().__init__(query_dim, value_dim)
        hidden = hidden_size or query_dim
        self.query_proj = nn.Linear(query_dim, hidden, bias=False)  # W_s
        self.key_proj = nn.Linear(value_dim, hidden, bias=True)  # W_h (with the layer's bias)
        self.v = nn.Linear(hidden, 1, bias=False)

    def prepare(self, states: Tensor, summary: Tensor) -> tuple[Tensor, Tensor]:
        keys = linear_rows(states, self.key_proj.weight, self.key_proj.bias)  # (B, S, A): once per sentence
        return keys.float(), states  # keys in fp32 (nmt.kernels.energy)

    def for_steps(self, keys: Tensor, values: Tensor, dtype: torch.dtype | None) -> tuple:
        """The keys with W_s for the steps (StepKeys: one gradient for each over all steps), the values as
        StepMatrix; W_s cast once to the autocast dtype where autocast is on."""
        w_s = StepWeight.of(self.query_proj.weight, autocast_dtype(keys.device.type))
        return StepKeys.of(keys, w_s, factored_keys), StepMatrix.of(values, dtype)

    def additive_v(self) -> Tensor:
        return self.v.weight.view(-1)

    def forward(self, query: Tensor, keys: Tensor, values: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        if isinstance(keys, StepKeys) and keys.query is not None and query.size(1) == 1:  # a training loop's step
            q = keys.query(query.squeeze(1)).unsqueeze(1)  # (B, 1, A)
        else:
            q = self.query_proj(query)  # (B, T, A)
        if q.size(1) == 1:  # a decoder step: one C++ kernel each way where they run (nmt.kernels.additive_step)
            step = additive_step(q.squeeze(1), keys, self.v.weight.view(-1), values, mask)
            if step is not None:
                context, weights = step  # (B, D), (B, S)
                return context.unsqueeze(1), weights.unsqueeze(1)
        weights = masked_softmax(self._energy(q, keys), mask)  # (B, T, S) fp32
        return bmm(weights, values), weights

    def score(self, query: Tensor, keys: Tensor) -> Tensor:
        return self._energy(self.query_proj(query), keys)

    def _energy(self, q: Tensor, keys: Tensor) -> Tensor:
        return additive_energy(q, keys, self.v.weight.view(-1))  # (B, T, S) fp32, fused (nmt.kernels.energy)


class LuongAttention(Attention):
    """Luong et al. (2015) global attention with score `dot` (s^T h), `general` (s^T W h) or
    `concat` (v^T tanh(W [s; h]), computed as v^T tanh(W_s s + W_h h) with W = [W_s W_h])."""

    def __init__(self, query_dim: int, value_dim: int, score: LuongScore = LuongScore.general):
        super().__init__(query_dim, value_dim)
        score = choice(LuongScore, score, "attention.score")
        if score == "dot" and query_dim != value_dim:
            raise ValueError(
                f"attention.score=dot needs the decoder hidden size ({query_dim}) to equal the encoder "
                f"output size ({value_dim}); use score=general or change model sizes"
            )
        self.score_name = score
        if score == "general":
            self.key_proj = nn.Linear(value_dim, query_dim, bias=False)  # W, applied to h once
        elif score == "concat":
            self.additive = AdditiveAttention(query_dim, value_dim)

    def prepare(self, states: Tensor, summary: Tensor) -> tuple[Tensor, Tensor]:
        if self.score_name == "general":
            return linear_rows(states, self.key_proj.weight), states  # (B, S, Q)
        if self.score_name == "concat":
            return self.additive.prepare(states, summary)
        return states, states

    def for_steps(self, keys: Tensor, values: Tensor, dtype: torch.dtype | None) -> tuple:
        if self.score_name == "concat":
            # its steps score through additive.score (nn.Linear W_s, the fused energy): StepKeys for the keys' sums
            # only, without the packed W_s and exp(-2k) that only AdditiveAttention's C++ step reads
            return StepKeys.of(keys), StepMatrix.of(values, dtype)
        return StepMatrix.of(keys, dtype, transpose=True), StepMatrix.of(values, dtype)

    def score(self, query: Tensor, keys: Tensor) -> Tensor:
        if self.score_name == "concat":
            return self.additive.score(query, keys)
        return bmm(query, keys, transpose=True)  # (B, T, S)


class MultiHeadAttention(Attention):
    """Scaled dot-product attention softmax(Q K^T / sqrt(d_k)) V over `heads` heads (Vaswani et al. 2017).

    Q = W_Q s, K = W_K h, V = W_V h (K and V once per sentence), output W_O [head_1; ...; head_n].
    The returned weights are the mean over heads, so they still sum to 1 over real tokens.

    The projections start Xavier-uniform, as in torch's nn.MultiheadAttention. With nn.Linear's default
    (smaller) init, a score is the product of two small random matrices, scaled by 1/sqrt(d_k) for unit-variance
    inputs, applied to LSTM states far below unit variance: the first scores are nearly equal at every
    position, attention starts uniform and its gradient is weak, and on the synthetic task some seeds
    learned the alignment much later than Luong's single-matrix score did.
    """

    def __init__(self, query_dim: int, value_dim: int, heads: int = 4):
        super().__init__(query_dim, value_dim)
        if query_dim % heads:
            raise ValueError(f"attention.heads={heads} must divide the decoder hidden size {query_dim}")
        self.heads, self.d_k = heads, query_dim // heads
        self.q_proj = nn.Linear(query_dim, query_dim, bias=False)
        self.k_proj = nn.Linear(value_dim, query_dim, bias=False)
        self.v_proj = nn.Linear(value_dim, query_dim, bias=False)
        self.out_proj = nn.Linear(query_dim, value_dim, bias=False)
        for proj in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            nn.init.xavier_uniform_(proj.weight)  # see the class docstring

    def _split(self, x: Tensor) -> Tensor:
        B, L, _ = x.shape
        return x.view(B, L, self.heads, self.d_k).transpose(1, 2)  # (B, heads, L, d_k)

    def prepare(self, states: Tensor, summary: Tensor) -> tuple[Tensor, Tensor]:
        k = linear_rows(states, self.k_proj.weight, self.k_proj.bias)  # (B, S, D)
        return self._split(k), self._split(linear_rows(states, self.v_proj.weight, self.v_proj.bias))

    def for_steps(self, keys: Tensor, values: Tensor, dtype: torch.dtype | None) -> tuple[Tensor, Tensor]:
        return keys, values  # (B, heads, S, d_k): left to autograd

    def forward(self, query: Tensor, keys: Tensor, values: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        B, T, _ = query.shape
        q = self._split(self.q_proj(query))  # (B, heads, T, d_k)
        with torch.autocast(query.device.type, enabled=False):  # in the keys' and values' dtype (nmt.device.step_dtype)
            scores = torch.matmul(q.to(keys.dtype), keys.transpose(-1, -2)) / math.sqrt(self.d_k)  # (B, heads, T, S)
            scores = scores.float().masked_fill(~mask[:, None, None, :], float("-inf"))
            weights = torch.softmax(scores, dim=-1)  # (B, heads, T, S)
            heads_out = torch.matmul(weights.to(values.dtype), values)  # (B, heads, T, d_k)
        context = self.out_proj(heads_out.transpose(1, 2).reshape(B, T, -1))  # (B, T, D)
        return context, weights.mean(dim=1)  # (B, T, S)


class LocalAttention(Attention):
    """Luong et al. (2015) local-p attention.

    The window centre p_t = (len - 1) * sigmoid(v_p^T tanh(W_p h_t)) is predicted from the query; positions
    within `window` (D) of p_t are scored with the `general` score and favoured by a Gaussian of sigma = D/2:
    weights = softmax over the window of (s^T W h + log N(s; p_t, sigma)). Luong multiplies the softmax by
    the Gaussian; doing it inside the softmax keeps the weights a distribution (summing to 1).
    """

    def __init__(self, query_dim: int, value_dim: int, window: int = 10):
        super().__init__(query_dim, value_dim)
        if window < 1:
            raise ValueError(f"attention.window must be >= 1, not {window}")
        self.window = window
        self.key_proj = nn.Linear(value_dim, query_dim, bias=False)
        self.position = nn.Sequential(nn.Linear(query_dim, query_dim), nn.Tanh(), nn.Linear(query_dim, 1))

    def prepare(self, states: Tensor, summary: Tensor) -> tuple[Tensor, Tensor]:
        return self.key_proj(states), states

    def forward(self, query: Tensor, keys: Tensor, values: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        last = (mask.sum(dim=1, keepdim=True) - 1).float()  # (B, 1) index of the last real token
        centre = last * torch.sigmoid(self.position(query).squeeze(-1).float())  # (B, T)
        positions = torch.arange(mask.size(1), device=query.device, dtype=torch.float32)  # (S,)
        distance = positions[None, None, :] - centre[:, :, None]  # (B, T, S)
        sigma = self.window / 2
        scores = bmm(query, keys, transpose=True).float() - distance.pow(2) / (2 * sigma**2)
        in_window = (distance.abs() <= self.window) & mask[:, None, :]  # the nearest token is always inside
        weights = torch.softmax(scores.masked_fill(~in_window, float("-inf")), dim=-1)  # (B, T, S)
        return bmm(weights, values), weights

    def for_steps(self, keys: Tensor, values: Tensor, dtype: torch.dtype | None) -> tuple:
        return StepMatrix.of(keys, dtype, transpose=True), StepMatrix.of(values, dtype)


ATTENTIONS: dict[str, type[Attention]] = {
    "none": NoAttention,
    "bahdanau": AdditiveAttention,
    "luong": LuongAttention,
    "multihead": MultiHeadAttention,
    "local": LocalAttention,
}


def build_attention(name: str, query_dim: int, value_dim: int, options: dict | None = None) -> Attention:
    """The attention registered as `name`, built with its own options (an unknown option fails)."""
    if name not in ATTENTIONS:
        raise ValueError(f"unknown attention {name!r}; choose one of: {', '.join(ATTENTIONS)}")
    cls = ATTENTIONS[name]
    try:
        return cls(query_dim, value_dim, **(options or {}))
    except TypeError as e:
        raise ValueError(f"attention={name} does not take option(s) {sorted(options or {})}: {e}") from None
