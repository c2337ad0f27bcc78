"""The sequence-to-sequence model: encoder + attention + decoder, and its typed config.

    model = Seq2Seq(ModelConfig(...), src_vocab=8000, tgt_vocab=8000)
    logits, weights = model(batch.src, batch.src_lengths, batch.tgt_in)   # (B, T, V), (B, T, S)

The loss is nmt.loss.token_loss; training passes `rows=loss_rows(batch.tgt_out)` so that the output layer
and the loss skip most padded target positions.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum

import torch
from torch import Tensor, nn

from nmt.attention import build_attention
from nmt.choices import Bridge, Query
from nmt.decoder import Decoder, DecoderState
from nmt.device import step_dtype
from nmt.encoder import Encoder, EncoderOutput
from nmt.layout import BatchLayout

# A change after which a checkpoint's weights no longer fit this code bumps nmt.checkpoint.MODEL_VERSION.


@dataclass
class ModelConfig:
    """Every knob of the architecture; the Hydra groups `model` and `attention` map onto it one to one."""

    embed_size: int = 256
    encoder_hidden_size: int = 256  # per direction
    encoder_layers: int = 1
    bidirectional: bool = True
    hidden_size: int = 512  # decoder
    decoder_layers: int = 1
    dropout: float = 0.3
    bridge: Bridge = Bridge.bridge  # bridge (tanh linear from the encoder's final states) | zero
    input_feeding: bool = True
    tie_embeddings: bool = False
    self_attention_layers: int = 0  # blocks of multi-head self-attention over the encoder's states (nmt.self_attention)
    self_attention_heads: int = 4  # heads per block; must divide the encoder state size
    attention: str = "luong"  # a name in nmt.attention.ATTENTIONS
    attention_query: Query = Query.current  # current (Luong order) | previous (Bahdanau order)
    attention_options: dict = field(default_factory=dict)  # the attention class's own arguments

    def to_dict(self) -> dict:
        """Plain values (choices as str): checkpoints are read with torch.load(weights_only=True)."""
        return {k: str(v) if isinstance(v, Enum) else v for k, v in asdict(self).items()}


class Seq2Seq(nn.Module):
    def __init__(self, config: ModelConfig, src_vocab: int, tgt_vocab: int):
        super().__init__()
        self.config, self.src_vocab, self.tgt_vocab = config, src_vocab, tgt_vocab
        self.encoder = Encoder(
            src_vocab,
            config.embed_size,
            config.encoder_hidden_size,
            config.encoder_layers,
            config.bidirectional,
            config.dropout,
            config.self_attention_layers,
            config.self_attention_heads,
        )
        # The attention draws its random numbers from a stream of its own, seeded by one draw that every
        # attention makes alike: the encoder, decoder and embeddings of one seed start from identical
        # weights whichever attention sits between them (the bottleneck study compares attentions alone).
        attention_seed = int(torch.randint(2**62, ()))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(attention_seed)
            attention = build_attention(
                config.attention, config.hidden_size, self.encoder.output_size, dict(config.attention_options)
            )
        self.decoder = Decoder(
            tgt_vocab,
            config.embed_size,
            config.hidden_size,
            self.encoder.output_size,
            config.encoder_layers,
            attention,
            num_layers=config.decoder_layers,
            dropout=config.dropout,
            query=config.attention_query,
            input_feeding=config.input_feeding,
            bridge=config.bridge,
            tie_embeddings=config.tie_embeddings,
        )

    @property
    def attention(self):
        return self.decoder.attention

    @property
    def has_self_attention(self) -> bool:
        return self.encoder.self_attention is not None

    @torch.no_grad()
    def self_attention_weights(self, src: Tensor, lengths: Tensor) -> list[Tensor]:
        """Each self-attention layer's weights over these sentences, [(B, N, S, S) fp32 per layer] ([] without
        the layer); what the pictures draw (nmt-translate --plot, nmt-serve, TensorBoard)."""
        if not self.has_self_attention:
            return []
        return list(self.encoder(src, lengths).self_attention)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def encode(
        self, src: Tensor, lengths: Tensor, order: Tensor | None = None
    ) -> tuple[EncoderOutput, Tensor, Tensor, DecoderState]:
        """Encode and set up decoding: (encoder output, attention keys, values, initial decoder state); `order`:
        the packed encoder's order on src's device, where the feed made it (nmt.layout)."""
        enc = self.encoder(src, lengths, order)
        keys, values = self.attention.prepare(enc.states, enc.summary)
        dtype = step_dtype(src.device.type)
        if dtype is not None:  # keys and values feed a product at every step: cast them once, not once per step
            values = values.to(dtype)
            if keys.dtype != torch.float32:  # the additive energy's keys stay fp32 on every device
                keys = keys.to(dtype)
        return enc, keys, values, self.decoder.init_state(enc)

    def forward(
        self,
        src: Tensor,
        lengths: Tensor,
        tgt_in: Tensor,
        rows: Tensor | None = None,
        tgt_lengths: Tensor | None = None,
        logits: bool = True,
        layout: BatchLayout | None = None,
        weights: bool = True,
    ) -> tuple[Tensor, Tensor | None]:
        """Teacher-forced logits (B, T, V) and attention weights (B, T, S); with `rows` (N,) the logits of
        those flat target positions only, (N, V) (nmt.loss.loss_rows: the loss's positions). `lengths` and
        `tgt_lengths` (B,), on the host: the sources' and targets' real lengths (tgt_lengths: counted from
        tgt_in when not given). `logits=False`: the output layer's input instead of the logits (H, not V).
        `layout` (nmt.layout): the batch's index tensors on the device, made by the feed, so that the step copies
        nothing from the host; `weights=False`: None for the weights (training reads none)."""
        order = None if layout is None else layout.src_order
        positions = None if layout is None else layout.loop_positions
        enc, keys, values, state = self.encode(src, lengths, order)
        return self.decoder(tgt_in, state, keys, values, enc.mask, rows, tgt_lengths, logits, positions, weights)
