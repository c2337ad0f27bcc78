"""The decoder: an LSTM that reads the previous word and an attention context, one step at a time.

Two orderings of attention and recurrence, named after their papers (`query`):

    current  (Luong et al. 2015)     h_t = LSTM([y_{t-1}; h~_{t-1}], h_{t-1})   (input feeding optional)
                                     c_t = attend(h_t);  h~_t = tanh(W_c [c_t; h_t])
    previous (Bahdanau et al. 2015)  c_t = attend(s_{t-1});  s_t = LSTM([y_{t-1}; c_t], s_{t-1})
                                     h~_t = tanh(W_c [c_t; s_t])

The output layer reads h~_t in both. `step` is the single step used by search; `forward` is the
teacher-forced pass and runs the same `_step` (with query=current and no input feeding, one LSTM call over
all steps followed by attention over all steps; with query=previous and no input feeding, the loop runs
attention and LSTM, and W_c runs once over all steps after it, or, when the attention reads no query
("none"), one LSTM call over [y_{t-1}; c] for all steps: the same arithmetic, batched).

The step loop runs the LSTM written out one step at a time (nmt.kernels.lstm_cell: nn.LSTM's parameters and arithmetic,
with the embeddings' share projected for all steps at once); scripts/step_benchmark.py measures training steps.
Where the compiled kernels run on a CPU, RNNsearch's loop (query=previous, no input feeding, one layer) runs
as one autograd node instead (nmt.kernels.decoder_loop: the same arithmetic, without autograd at every step),
and so does, in fp32, the input-feeding loop of Luong's order with the additive score and one layer, the
multi30k_deen preset's (nmt.kernels.feed_loop).
On a batch sorted longest target first (the training sampler's order) the loop leaves each sentence once its
target has ended: step t computes the sentences longer than t only (`active_rows`), and the positions after
a sentence's end, which the loss skips, get zeros.

Shapes: B batch, S source length, T target length, E embedding, H decoder hidden, D encoder state, V vocab.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.attention import Attention
from nmt.choices import Bridge, Query, choice
from nmt.device import autocast_dtype, step_dtype
from nmt.dropout import Dropout
from nmt.encoder import EncoderOutput
from nmt.kernels.decoder_loop import decoder_loop, loop_positions, scatter_steps
from nmt.kernels.energy import StepKeys
from nmt.kernels.feed_loop import feed_loop, feed_plan
from nmt.kernels.lstm_cell import LayerParams, layer, layer_params, lstm_step
from nmt.kernels.stepweight import StepMatrix, StepWeight
from nmt.precision import run_lstm
from nmt.shapes import linear_rows, padded_count
from nmt.special import PAD_ID


class DecoderState(NamedTuple):
    h: Tensor  # (L, B, H)
    c: Tensor  # (L, B, H)
    feed: Tensor  # (B, H) the previous attentional state h~_{t-1} (zeros at t = 0)

    def select(self, index: Tensor) -> DecoderState:
        """Reorder/replicate along the batch (beam search)."""
        h, c = self.h.index_select(1, index), self.c.index_select(1, index)
        return DecoderState(h, c, self.feed.index_select(0, index))


class StepParams(NamedTuple):
    layers: list[LayerParams]
    combine: StepWeight  # W_c (H, D + H)


class Decoder(nn.Module):
    def __init__(
        self,
        vocab_size: int,
        embed_size: int,
        hidden_size: int,
        encoder_size: int,
        encoder_layers: int,
        attention: Attention,
        num_layers: int = 1,
        dropout: float = 0.0,
        query: Query = Query.current,
        input_feeding: bool = True,
        bridge: Bridge = Bridge.bridge,
        tie_embeddings: bool = False,
    ):
        super().__init__()
        query, bridge = choice(Query, query, "attention.query"), choice(Bridge, bridge, "model.bridge")
        self.query, self.input_feeding, self.bridge_kind = query, input_feeding, bridge
        self.num_layers, self.hidden_size, self.encoder_layers = num_layers, hidden_size, encoder_layers
        self.attention = attention
        self.embed = nn.Embedding(vocab_size, embed_size, padding_idx=PAD_ID)
        self.dropout = Dropout(dropout)
        self.layer_dropout = Dropout(dropout if num_layers > 1 else 0.0)  # between stacked layers
        rnn_input = embed_size + (hidden_size if input_feeding else 0) + (encoder_size if query == "previous" else 0)
        self.rnn = nn.LSTM(
            rnn_input, hidden_size, num_layers=num_layers, batch_first=True, dropout=dropout if num_layers > 1 else 0.0
        )
        self.combine = nn.Linear(encoder_size + hidden_size, hidden_size, bias=False)  # W_c
        self.output = nn.Linear(hidden_size, vocab_size)
        if tie_embeddings:
            if embed_size != hidden_size:
                raise ValueError(
                    f"model.tie_embeddings needs embed_size == hidden_size ({embed_size} != {hidden_size})"
                )
            self.output.weight = self.embed.weight
        if bridge == "bridge":
            self.bridge_h = nn.Linear(encoder_size, hidden_size)
            self.bridge_c = nn.Linear(encoder_size, hidden_size)

    # ----------------------------------------------------------------------------------------- state
    def init_state(self, enc: EncoderOutput) -> DecoderState:
        """Initial decoder state from the encoder's final states (`bridge`) or zeros (`zero`)."""
        B = enc.states.size(0)
        zeros = enc.states.new_zeros(self.num_layers, B, self.hidden_size)
        feed = enc.states.new_zeros(B, self.hidden_size)
        if self.bridge_kind == "zero":
            return DecoderState(zeros, zeros.clone(), feed)
        # layer l of the decoder starts from layer l of the encoder when the depths match, else from the top
        if self.encoder_layers == self.num_layers:
            fh, fc = enc.final_h, enc.final_c  # (L, B, D)
        else:
            fh = enc.final_h[-1:].expand(self.num_layers, -1, -1)
            fc = enc.final_c[-1:].expand(self.num_layers, -1, -1)
        return DecoderState(torch.tanh(self.bridge_h(fh)).contiguous(), self.bridge_c(fc).contiguous(), feed)

    # ----------------------------------------------------------------------------------------- steps
    def step_params(self, device: torch.device) -> StepParams:
        """The parameters used at every step, arranged once per batch (and cast once, not once per step,
        to the autocast dtype if autocast is on for `device`): the LSTM's layers (nmt.kernels.lstm_cell.layer_params)
        and W_c."""
        dtype = autocast_dtype(device.type)
        return StepParams(
            layer_params(self.rnn, self.embed.embedding_dim, dtype), StepWeight.of(self.combine.weight, dtype)
        )

    def _inputs(self, emb: Tensor, params: StepParams, all_steps: bool = True) -> Tensor:
        """Layer 0's input projection: emb (B, T, E) -> (B, T, 4H) for every step at once (or the feed loop's
        rows, (N, E) -> (N, 4H)), its rows padded to a few shapes under autocast (nmt.shapes: bf16 kernels are
        built per shape); search's single step, emb (B, E) -> (B, 4H), with `all_steps=False` (a handful of rows,
        not padded up to 64). In fp32 one addmm with the bias: padded rows cost a zero-filled copy of the
        gradient in the backward (16 MB a batch of the multi30k_deen preset) and the bias a pass of its own."""
        first = params.layers[0]
        emb = emb.to(first.w_x.dtype)
        if all_steps and autocast_dtype(emb.device.type) is None:
            return F.linear(emb, first.w_x, first.bias)
        return (linear_rows(emb, first.w_x) if all_steps else F.linear(emb, first.w_x)) + first.bias

    def _step(
        self, x0: Tensor, state: DecoderState, keys: Tensor, values: Tensor, mask: Tensor, params: StepParams
    ) -> tuple[Tensor, DecoderState, Tensor]:
        """One step from layer 0's precomputed input x0 (B, 4H) -> (h~_t (B, H), new state, weights (B, S))."""
        context, out, state, weights = self._recurrence(x0, state, keys, values, mask, params)
        attn_h = self._attentional(params.combine, context, out)  # (B, H)
        return attn_h, DecoderState(state.h, state.c, attn_h), weights  # (B, H), state, (B, S)

    def _attentional(self, combine, context: Tensor, out: Tensor) -> Tensor:
        """h~ = dropout(tanh(W_c [c; h])): context (..., D), out (..., H) -> (..., H); `combine` is W_c (the
        module, or the loop's StepWeight)."""
        return self.dropout(torch.tanh(combine(torch.cat([context.to(out.dtype), out], dim=-1))))

    def _recurrence(
        self, x0: Tensor, state: DecoderState, keys: Tensor, values: Tensor, mask: Tensor, params: StepParams
    ) -> tuple[Tensor, Tensor, DecoderState, Tensor]:
        """A step's attention and LSTM, without W_c: x0 (B, 4H) -> (c_t (B, D), top output (B, H), new state
        (its feed not yet updated), weights (B, S))."""
        recurrent = [state.feed] if self.input_feeding else []
        if self.query == "previous":
            context, weights = self.attention(layer(state.h, -1).unsqueeze(1), keys, values, mask)  # (B, 1, D)
            recurrent.append(context.squeeze(1))
        out, h, c = lstm_step(x0, recurrent, state.h, state.c, params.layers, self.layer_dropout)  # out (B, H)
        if self.query == "current":
            context, weights = self.attention(out.unsqueeze(1), keys, values, mask)  # (B, 1, D)
        # squeeze/unsqueeze, not [:, 0]: a view whose backward is a view (select's allocates and copies)
        return context.squeeze(1), out, DecoderState(h, c, state.feed), weights.squeeze(1)

    def step(
        self,
        prev: Tensor,
        state: DecoderState,
        keys: Tensor,
        values: Tensor,
        mask: Tensor,
        params: StepParams | None = None,
        rows: Tensor | None = None,
        logits: bool = True,
    ) -> tuple[Tensor, DecoderState, Tensor]:
        """Search's single step: previous ids (B,) -> (logits (B, V), new state, weights (B, S)).

        Pass `params=decoder.step_params(device)`, computed once, when calling step after step. With `rows`
        (N,), the logits of those rows only, (N, V): the output layer, a step's largest product, skips the rest.
        With `logits=False` the output layer's input h~ comes back instead ((B, H) or (N, H)): the search runs
        the layer itself (nmt.kernels.top_logprobs).
        """
        params = self.step_params(prev.device) if params is None else params
        x0 = self._inputs(self.dropout(self.embed(prev)), params, all_steps=False)  # (B, 4H)
        attn_h, state, weights = self._step(x0, _fp32_cells(state), keys, values, mask, params)
        attn_h = attn_h if rows is None else attn_h.index_select(0, rows)
        return (self.output(attn_h) if logits else attn_h), state, weights

    def forward(
        self,
        tgt_in: Tensor,
        state: DecoderState,
        keys: Tensor,
        values: Tensor,
        mask: Tensor,
        rows: Tensor | None = None,
        tgt_lengths: Tensor | None = None,
        logits: bool = True,
        positions: Tensor | None = None,
        weights: bool = True,
    ) -> tuple[Tensor, Tensor | None]:
        """Teacher forcing: tgt_in (B, T) -> (logits (B, T, V), weights (B, T, S)).

        With `rows` (N,), flat indices into the B x T positions (nmt.loss.loss_rows), the output layer runs
        on those positions only and the logits are (N, V), in the order of `rows`. `tgt_lengths` (B,), on the
        host, the targets' lengths (nmt.data.Batch): the loop's rows are then counted from them (active_rows),
        with nothing read back from tgt_in's device. With `logits=False` the output layer's input h~ comes
        back instead of its output ((B, T, H) or (N, H)): nmt.loss.output_loss_sum runs the layer itself.
        `positions` (N,), on tgt_in's device: the loop's rows' places (nmt.layout), made by the feed, where the
        loop would otherwise copy them from the host. `weights=False` (training): None for the weights, which
        the loop then never lays out."""
        attn_h, attn = self._attentional_states(tgt_in, state, keys, values, mask, tgt_lengths, positions, weights)
        if rows is not None:
            attn_h = attn_h.reshape(-1, attn_h.size(-1)).index_select(0, rows)  # (N, H)
        return (self.output(attn_h) if logits else attn_h), (attn if weights else None)

    def _attentional_states(
        self,
        tgt_in: Tensor,
        state: DecoderState,
        keys: Tensor,
        values: Tensor,
        mask: Tensor,
        tgt_lengths: Tensor | None = None,
        positions: Tensor | None = None,
        need_weights: bool = True,
    ) -> tuple[Tensor, Tensor | None]:
        """h~_t for every step, teacher-forced: tgt_in (B, T) -> (h~ (B, T, H), weights (B, T, S)); the
        step-by-step loop leaves the weights out (None) where they are not needed."""
        emb = self.dropout(self.embed(tgt_in))  # (B, T, E)
        if self.query == "current" and not self.input_feeding:
            # no step depends on the previous step's attention: one LSTM call, then attend everywhere at once
            out, _ = run_lstm(self.rnn, emb, (state.h, state.c))  # (B, T, H)
            context, weights = self.attention(out, keys, values, mask)  # (B, T, D), (B, T, S)
            return self._attentional(self.combine, context, out), weights  # (B, T, H)
        if not self.attention.reads_query and not self.input_feeding:
            # query=previous with a context that reads no query ("none", RNNencdec): every step's context is
            # known before the loop, so the LSTM reads [y_{t-1}; c] in one call (the loop's arithmetic)
            context, weights = self.attention(emb, keys, values, mask)  # emb gives B and T only: (B, T, D)
            out, _ = run_lstm(self.rnn, torch.cat([emb, context.to(emb.dtype)], dim=-1), (state.h, state.c))
            return self._attentional(self.combine, context, out), weights  # (B, T, H)
        params = self.step_params(tgt_in.device)
        keys, values = self.attention.for_steps(keys, values, step_dtype(tgt_in.device.type))
        state = _fp32_cells(state)
        multiple = STEP_ROW_MULTIPLE if autocast_dtype(tgt_in.device.type) is not None else 1
        active = active_rows(tgt_in, multiple, tgt_lengths)  # rows computed at each step (B while none has ended)
        if positions is not None and positions.numel() != sum(active):  # shapes only: nothing read from it
            raise ValueError(
                f"the batch's layout has {positions.numel()} loop rows, the loop {sum(active)}: "
                "made for another step multiple (nmt.layout.batch_layout)"
            )
        if self.input_feeding and self.query == "current":  # Luong's order with input feeding: one node where it runs
            dropout = partial(self.dropout.mask, dtype=torch.float32)
            v = self.attention.additive_v()
            plan = feed_plan(v, state.h, keys, values, mask, params.layers, params.combine, active, dropout)
            if plan is not None:  # layer 0's input for the loop's rows only, step after step (N, 4H)
                x0 = self._inputs(emb.flatten(0, 1).index_select(0, plan.positions), params)
                attn_h, weights = feed_loop(plan, x0, state.h, state.c, state.feed, keys, values)  # (N, H), (N, S)
                T = tgt_in.size(1)
                laid = _unpack([weights], active, T, plan.positions) if need_weights else None
                return _unpack([attn_h], active, T, plan.positions), laid
        x0_all = self._inputs(emb, params)  # (B, T, 4H)
        if not self.input_feeding and self.query == "previous":  # RNNsearch: the loop as one node where it runs
            loop = decoder_loop(
                self.attention.additive_v(), x0_all, state.h, state.c, keys, values, mask, params.layers, active
            )
            if loop is not None:
                context, out, weights = loop  # (N, D), (N, H), (N, S)
                attn_h = self._attentional(self.combine, context, out)  # (N, H)
                T = tgt_in.size(1)
                laid = _unpack([weights], active, T, positions) if need_weights else None
                return _unpack([attn_h], active, T, positions), laid
        outputs, contexts, all_weights = [], [], []
        for x0, n in zip(x0_all.unbind(1), active, strict=True):  # unbind: one backward
            if n < state.feed.size(0):  # the sentences from row n on have ended: go on without them
                state = DecoderState(state.h[:, :n], state.c[:, :n], state.feed[:n])
                keys, values, mask = first_rows(keys, n), first_rows(values, n), mask[:n]
            x0 = x0 if n == x0.size(0) else x0[:n]  # (n, 4H)
            if self.input_feeding:
                attn_h, state, weights = self._step(x0, state, keys, values, mask, params)
                outputs.append(attn_h)
            else:  # no step reads h~: W_c runs once over all steps after the loop (the same arithmetic)
                context, out, state, weights = self._recurrence(x0, state, keys, values, mask, params)
                contexts.append(context)
                outputs.append(out)
            all_weights.append(weights)
        if not self.input_feeding:  # (N, D), (N, H) -> h~ (N, H), N the rows computed over all steps
            outputs = [self._attentional(self.combine, torch.cat(contexts), torch.cat(outputs))]
        T = tgt_in.size(1)
        return _unpack(outputs, active, T, positions), (
            _unpack(all_weights, active, T, positions) if need_weights else None
        )


STEP_ROW_MULTIPLE = 8  # under autocast, rows per step rounded up to this: a few matmul shapes (nmt.shapes)


def active_rows(tgt_in: Tensor, multiple: int = 1, lengths: Tensor | None = None) -> list[int]:
    """How many sentences (rows) the teacher-forced loop computes at each of the T steps of tgt_in (B, T).

    Where the target lengths do not grow down the batch (the training sampler sorts each batch so), the
    sentences still being decoded at step t are the first n_t rows: the loop computes those only, n_t
    rounded up to a multiple of `multiple` (at most B), and the positions after a sentence's end get no
    output. Otherwise every row at every step. The lengths are counted in tgt_in, or given (B,) on the host."""
    B, T = tgt_in.shape
    if lengths is None:
        lengths = (tgt_in != PAD_ID).sum(dim=1)  # BOS and the target but its last piece: its length
    lengths = lengths.tolist()
    if any(a < b for a, b in zip(lengths, lengths[1:], strict=False)):
        return [B] * T
    rows, n = [], B
    for t in range(T):
        while n > 1 and lengths[n - 1] <= t:
            n -= 1
        rows.append(min(B, padded_count(n, multiple)))
    return rows


def first_rows(x, n: int):
    """The first n sentences of the attention's keys or values (a tensor, StepKeys or StepMatrix)."""
    return x.rows(n) if isinstance(x, (StepKeys, StepMatrix)) else x[:n]


def _unpack(steps: list[Tensor], active: list[int], T: int, positions: Tensor | None = None) -> Tensor:
    """The loop's per-step rows, (n_t, X) each or already joined (N, X), as (B, T, X) in the batch's order,
    with zeros where no row was computed; `positions`: loop_positions(active, T), where known."""
    B = active[0]
    if all(n == B for n in active):
        return torch.stack(steps, dim=1) if len(steps) == T else steps[0].view(T, B, -1).transpose(0, 1)
    rows = steps[0] if len(steps) == 1 else torch.cat(steps)  # (N, X), step by step
    positions = loop_positions(active, T, rows.device) if positions is None else positions
    return scatter_steps(rows, positions, B, T)


def _fp32_cells(state: DecoderState) -> DecoderState:
    """The cell state accumulates over many steps: keep it in fp32 even under bf16 autocast."""
    return state if state.c.dtype == torch.float32 else DecoderState(state.h, state.c.float(), state.feed)
