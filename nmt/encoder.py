"""The encoder: embeddings, a (bi)LSTM over the source sentence, and optionally self-attention over its states.

With `self_attention_layers` > 0, blocks of multi-head self-attention (nmt.self_attention) follow the LSTM:
every state is rewritten from the states of the whole sentence. The LSTM's final states still start the
decoder (the bridge); the fixed sentence vector that `attention=none` reads is taken from the self-attended
states, at the positions the LSTM's final states come from (the last real token for the forward direction,
the first for the backward one).

Shapes: B batch, S source length, E embedding size, H hidden size per direction,
D = H * directions (the size of each encoder state), L layers, N self-attention heads.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence, invert_permutation, pack_padded_sequence, pad_packed_sequence

from nmt.device_plan import to_device
from nmt.dropout import Dropout
from nmt.kernels.encoder_lstm import encoder_lstm
from nmt.precision import run_lstm
from nmt.self_attention import SelfAttentionStack
from nmt.special import PAD_ID

MAX_LENGTH_GROUPS = 8  # a CPU batch with more source lengths than this takes the packed LSTM (see _by_length)


class EncoderOutput(NamedTuple):
    states: Tensor  # (B, S, D) top-layer output at every position, zero on padding; contiguous
    final_h: Tensor  # (L, B, D) last hidden state per layer, directions joined [fwd; bwd]
    final_c: Tensor  # (L, B, D) last cell state per layer, directions joined
    mask: Tensor  # (B, S) True on real tokens
    summary: Tensor  # (B, D) the fixed-length sentence vector `attention=none` reads at every step (below)
    self_attention: tuple[Tensor, ...] = ()  # per self-attention layer, its weights (B, N, S, S) fp32


class Encoder(nn.Module):
    def __init__(
        self,
        vocab_size: int,
        embed_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bidirectional: bool = True,
        dropout: float = 0.0,
        self_attention_layers: int = 0,
        self_attention_heads: int = 4,
    ):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embed_size, padding_idx=PAD_ID)
        self.dropout = Dropout(dropout)
        self.rnn = nn.LSTM(
            embed_size,
            hidden_size,
            num_layers=num_layers,
            bidirectional=bidirectional,
            batch_first=True,
            dropout=dropout if num_layers > 1 else 0.0,
        )
        self.num_layers, self.directions = num_layers, 2 if bidirectional else 1
        self.output_size = hidden_size * self.directions
        if self_attention_layers < 0:
            raise ValueError(f"model.self_attention_layers must be 0 or more, not {self_attention_layers}")
        self.self_attention = None
        if self_attention_layers:
            # its own random stream, derived from the run's seed without drawing from it: the LSTMs, embeddings
            # and decoder of one seed start from the same weights with and without the layers
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed((torch.initial_seed() + 7919) % 2**63)
                self.self_attention = SelfAttentionStack(
                    self_attention_layers, self_attention_heads, self.output_size, dropout
                )

    def forward(self, src: Tensor, lengths: Tensor, order: Tensor | None = None) -> EncoderOutput:
        """src (B, S) ids, lengths (B,) real lengths on the CPU -> EncoderOutput. `order` (B,), on src's device:
        the sentences by length, longest first, where the caller has it there (nmt.layout); else made here."""
        B, S = src.shape
        mask = src != PAD_ID  # (B, S)
        x = self.dropout(self.embed(src))  # (B, S, E)
        listed = lengths.tolist()  # on the host: nothing is read back from a device
        n_lengths = len(set(listed))
        if n_lengths == 1 and listed[0] == S:
            # every sentence fills the batch: no packing needed (and the faster LSTM kernel applies)
            states, (h, c) = _lstm(self.rnn, x)
        elif x.device.type == "cpu" and n_lengths <= MAX_LENGTH_GROUPS:
            states, (h, c) = self._by_length(x, lengths)
        else:
            packed_states, (h, c) = self.rnn(_pack(x, lengths.cpu(), order))
            states = _unpack(packed_states, S)  # (B, S, D)
        # contiguous once here: the unpacked LSTM's batch_first output is a transposed (S, B, D) buffer, and a
        # decoder step's kernel (nmt.kernels.additive_step) or search step would otherwise copy it at every step
        states = self.dropout(states.contiguous())
        final_h, final_c = self._join(h), self._join(c)  # (L, B, D) each
        if self.self_attention is None:
            # the top layer's final state, [fwd at the last real token; bwd at the first token]
            return EncoderOutput(states, final_h, final_c, mask, final_h[-1])
        states, weights = self.self_attention(states, mask)  # (B, S, D), [(B, N, S, S)]
        return EncoderOutput(states, final_h, final_c, mask, self._summary(states, mask), tuple(weights))

    def _summary(self, states: Tensor, mask: Tensor) -> Tensor:
        """(B, D) read from `states` (B, S, D) where the LSTM's final states stand: the forward half at the last
        real token, the backward half at the first. The lengths are counted in the mask (B, S) on the device:
        the host's, copied here, would make a GPU's host wait."""
        last = (mask.sum(dim=1) - 1).clamp(min=0)  # (B,)
        at_last = states[torch.arange(states.size(0), device=states.device), last]  # (B, D)
        if self.directions == 1:
            return at_last
        half = self.output_size // 2
        return torch.cat([at_last[:, :half], states[:, 0, half:]], dim=-1)  # (B, D)

    def _by_length(self, x: Tensor, lengths: Tensor) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """The LSTM over each group of equal source length on its own, unpacked, joined back in batch order:
        x (B, S, E) -> (states (B, S, D), (h, c) (L * dirs, B, H)), as the packed call returns them.

        On a CPU the packed LSTM is a much slower kernel than the unpacked one: a batch of 37 sentences of
        113 pieces, one of them a piece shorter, took 221 ms forward and backward packed, 50 ms in two groups,
        74 ms in eight (2-core Intel Xeon; the README's long-input section). Exact bucketing's merged batches
        mostly hold two lengths; batches of many lengths (sorted bucketing) stay packed."""
        B, S, _ = x.shape
        order = torch.argsort(lengths, stable=True)  # (B,) each length's sentences together
        states, hs, cs = [], [], []
        for group in torch.split(order, torch.unique_consecutive(lengths[order], return_counts=True)[1].tolist()):
            n = int(lengths[group[0]])
            out, (h, c) = _lstm(self.rnn, x[group, :n])  # (b, n, D), (L * dirs, b, H)
            states.append(F.pad(out, (0, 0, 0, S - n)))  # (b, S, D), zero on padding
            hs.append(h)
            cs.append(c)
        back = torch.argsort(order)  # (B,) batch position -> row of the joined groups
        return torch.cat(states)[back], (torch.cat(hs, dim=1)[:, back], torch.cat(cs, dim=1)[:, back])

    def _join(self, h: Tensor) -> Tensor:
        """(L * dirs, B, H), ordered [fwd_1, bwd_1, fwd_2, ...] by PyTorch -> (L, B, dirs * H)."""
        LD, B, H = h.shape
        h = h.view(self.num_layers, self.directions, B, H)  # (L, dirs, B, H)
        return h.transpose(1, 2).reshape(self.num_layers, B, self.directions * H)  # (L, B, D)


def _lstm(rnn: nn.LSTM, x: Tensor) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """rnn(x) for an unpacked (B, S, E) batch: nmt.kernels.encoder_lstm where it applies, else nn.LSTM's kernel."""
    return encoder_lstm(rnn, x) or run_lstm(rnn, x)


def _pack(x: Tensor, lengths: Tensor, order: Tensor | None = None) -> PackedSequence:
    """pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False), the same sequence, with its
    order (from `lengths`, on the host) on x's device: `order` where given (the feed copied it ahead,
    nmt.layout), else copied now without waiting (nmt.device_plan.to_device): torch's own copy waits for the
    device, a host synchronisation in a GPU's training step."""
    lengths, host_order = torch.sort(lengths, descending=True)  # as pack_padded_sequence sorts
    order = to_device(host_order, x.device) if order is None else order
    packed = pack_padded_sequence(x.index_select(0, order), lengths, batch_first=True)
    return PackedSequence(packed.data, packed.batch_sizes, order, invert_permutation(order))


def _unpack(packed: PackedSequence, S: int) -> Tensor:
    """pad_packed_sequence(packed, batch_first=True, total_length=S)'s padded (B, S, D) alone: torch's also
    reorders the lengths with a copy of the order back to the host, which waits for a GPU."""
    in_order = PackedSequence(packed.data, packed.batch_sizes)  # longest first, as packed
    return pad_packed_sequence(in_order, batch_first=True, total_length=S)[0].index_select(0, packed.unsorted_indices)
