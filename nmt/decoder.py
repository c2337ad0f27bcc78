"""The decoder: an LSTM that reads the previous word and an attention context, one step at a time.

Two orderings of attention and recurrence, named after their papers (`query`):

    current  (Luong et al. 2015)     h_t = LSTM([y_{t-1}; h~_{t-1}], h_{t-1})   (input feeding optional)
                                     c_t = attend(h_t);  h~_t = tanh(W_c [c_t; h_t])
    previous (Bahdanau et al. 2015)  c_t = attend(s_{t-1});  s_t = LSTM([y_{t-1}; c_t], s_{t-1})
                                     h~_t = tanh(W_c [c_t; s_t])

The output layer reads h~_t in both. `step` is the single step used by search; `forward` is the
teacher-forced pass and runs the same `_step` (or, with query=current and no input feeding, one LSTM
call over all steps followed by attention over all steps: the same arithmetic, batched).

Shapes: B batch, S source length, T target length, E embedding, H decoder hidden, D encoder state, V vocab.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from nmt.attention import Attention
from nmt.encoder import EncoderOutput
from nmt.tokenizer import PAD_ID


class DecoderState(NamedTuple):
    h: Tensor  # (L, B, H)
    c: Tensor  # (L, B, H)
    feed: Tensor  # (B, H) the previous attentional state h~_{t-1} (zeros at t = 0)

    def select(self, index: Tensor) -> DecoderState:
        """Reorder/replicate along the batch (beam search)."""
        h, c = self.h.index_select(1, index), self.c.index_select(1, index)
        return DecoderState(h, c, self.feed.index_select(0, index))


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
        query: str = "current",
        input_feeding: bool = True,
        bridge: str = "bridge",
        tie_embeddings: bool = False,
    ):
        super().__init__()
        if query not in ("current", "previous"):
            raise ValueError(f"attention.query must be 'current' (Luong) or 'previous' (Bahdanau), not {query!r}")
        if bridge not in ("bridge", "zero"):
            raise ValueError(f"model.bridge must be 'bridge' or 'zero', not {bridge!r}")
        self.query, self.input_feeding, self.bridge_kind = query, input_feeding, bridge
        self.num_layers, self.hidden_size, self.encoder_layers = num_layers, hidden_size, encoder_layers
        self.attention = attention
        self.embed = nn.Embedding(vocab_size, embed_size, padding_idx=PAD_ID)
        self.dropout = nn.Dropout(dropout)
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
    def _step(
        self, emb: Tensor, state: DecoderState, keys: Tensor, values: Tensor, mask: Tensor
    ) -> tuple[Tensor, DecoderState, Tensor]:
        """One step from an embedded previous word emb (B, E) -> (h~_t (B, H), new state, weights (B, S))."""
        inputs = [emb]
        if self.input_feeding:
            inputs.append(state.feed)
        if self.query == "previous":
            context, weights = self.attention(state.h[-1][:, None, :], keys, values, mask)  # (B, 1, D)
            inputs.append(context[:, 0])
        out, (h, c) = self.rnn(torch.cat(inputs, dim=-1)[:, None, :], (state.h, state.c))  # out (B, 1, H)
        if self.query == "current":
            context, weights = self.attention(out, keys, values, mask)  # (B, 1, D)
        attn_h = self.dropout(torch.tanh(self.combine(torch.cat([context, out], dim=-1))))[:, 0]  # (B, H)
        return attn_h, DecoderState(h, c, attn_h), weights[:, 0]

    def step(
        self, prev: Tensor, state: DecoderState, keys: Tensor, values: Tensor, mask: Tensor
    ) -> tuple[Tensor, DecoderState, Tensor]:
        """Search's single step: previous ids (B,) -> (logits (B, V), new state, weights (B, S))."""
        attn_h, state, weights = self._step(self.dropout(self.embed(prev)), state, keys, values, mask)
        return self.output(attn_h), state, weights

    def forward(
        self, tgt_in: Tensor, state: DecoderState, keys: Tensor, values: Tensor, mask: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Teacher forcing: tgt_in (B, T) -> (logits (B, T, V), weights (B, T, S))."""
        emb = self.dropout(self.embed(tgt_in))  # (B, T, E)
        if self.query == "current" and not self.input_feeding:
            # no step depends on the previous step's attention: one LSTM call, then attend everywhere at once
            out, _ = self.rnn(emb, (state.h, state.c))  # (B, T, H)
            context, weights = self.attention(out, keys, values, mask)  # (B, T, D), (B, T, S)
            attn_h = self.dropout(torch.tanh(self.combine(torch.cat([context, out], dim=-1))))  # (B, T, H)
            return self.output(attn_h), weights
        outputs, all_weights = [], []
        for t in range(tgt_in.size(1)):
            attn_h, state, weights = self._step(emb[:, t], state, keys, values, mask)
            outputs.append(attn_h)
            all_weights.append(weights)
        attn_h = torch.stack(outputs, dim=1)  # (B, T, H)
        return self.output(attn_h), torch.stack(all_weights, dim=1)  # (B, T, V), (B, T, S)
