"""The sequence-to-sequence model: encoder + attention + decoder, its typed config and its loss.

    model = Seq2Seq(ModelConfig(...), src_vocab=8000, tgt_vocab=8000)
    logits, weights = model(batch.src, batch.src_lengths, batch.tgt_in)   # (B, T, V), (B, T, S)
    loss_sum, n_tokens = token_loss(logits, batch.tgt_out, label_smoothing=0.1)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
from torch import Tensor, nn

from nmt.attention import build_attention
from nmt.decoder import Decoder, DecoderState
from nmt.encoder import Encoder, EncoderOutput
from nmt.tokenizer import PAD_ID

MODEL_VERSION = 1  # bumped when a checkpoint's weights stop fitting the code
LOSS_CHUNK_ROWS = 2048  # target tokens per piece when the loss is computed without gradients


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
    bridge: str = "bridge"  # bridge | zero
    input_feeding: bool = True
    tie_embeddings: bool = False
    attention: str = "luong"  # a name in nmt.attention.ATTENTIONS
    attention_query: str = "current"  # current (Luong order) | previous (Bahdanau order)
    attention_options: dict = field(default_factory=dict)  # the attention class's own arguments

    def to_dict(self) -> dict:
        return asdict(self)


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

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def encode(self, src: Tensor, lengths: Tensor) -> tuple[EncoderOutput, Tensor, Tensor, DecoderState]:
        """Encode and set up decoding: (encoder output, attention keys, values, initial decoder state)."""
        enc = self.encoder(src, lengths)
        keys, values = self.attention.prepare(enc.states, enc.summary)
        return enc, keys, values, self.decoder.init_state(enc)

    def forward(self, src: Tensor, lengths: Tensor, tgt_in: Tensor) -> tuple[Tensor, Tensor]:
        """Teacher-forced logits (B, T, V) and attention weights (B, T, S)."""
        enc, keys, values, state = self.encode(src, lengths)
        return self.decoder(tgt_in, state, keys, values, enc.mask)


class _SmoothedCrossEntropy(torch.autograd.Function):
    """Summed label-smoothed cross-entropy of logits (N, V) against target (N,), skipping PAD targets.

    loss_n = (1 - eps) * (lse_n - x_n[y_n]) + eps * (lse_n - mean_v x_n[v]), lse_n = logsumexp_v x_n[v],
    the same value as F.cross_entropy(..., label_smoothing=eps, reduction="sum"). Written out because its
    gradient is one expression, softmax(x) - (1 - eps) onehot(y) - eps / V, computed in place in two passes
    over the (N, V) logits, where autograd's log_softmax/nll path takes about twice as many (a third of the
    loss's time in a bf16 training step on a CPU). Everything is fp32, whatever the dtype of the logits.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, eps: float) -> Tensor:
        real = target != PAD_ID  # (N,)
        x = logits.float()
        lse = torch.logsumexp(x, dim=-1)  # (N,)
        picked = x.gather(1, target[:, None]).squeeze(1)  # (N,)
        loss = (1 - eps) * (lse - picked)
        if eps:
            loss = loss + eps * (lse - x.mean(dim=-1))
        ctx.save_for_backward(logits, target, lse, real)
        ctx.eps = eps
        return loss.masked_fill(~real, 0.0).sum()

    @staticmethod
    def backward(ctx, grad: Tensor):
        logits, target, lse, real = ctx.saved_tensors
        eps, V = ctx.eps, logits.size(-1)
        g = logits.to(torch.float32, copy=True)  # a new tensor even for fp32 logits: it is changed in place
        g.sub_(lse[:, None]).exp_()  # softmax
        if eps:
            g.sub_(eps / V)
        g.scatter_add_(1, target[:, None], g.new_full((len(target), 1), -(1 - eps)))
        g.mul_((grad * real)[:, None])
        return g.to(logits.dtype), None, None


def token_loss(logits: Tensor, target: Tensor, label_smoothing: float = 0.0) -> tuple[Tensor, int]:
    """Summed cross-entropy over real target tokens (padding ignored) and their count.

    Divide the sum by the count (over a whole accumulated batch) for the per-token loss.
    Computed in fp32 whatever the autocast dtype.
    """
    V = logits.size(-1)
    logits, target = logits.reshape(-1, V), target.reshape(-1)
    n_real = int((target != PAD_ID).sum())
    if torch.is_grad_enabled():
        return _SmoothedCrossEntropy.apply(logits, target, float(label_smoothing)), n_real
    # no gradient (validation): a few thousand rows at a time, so the fp32 temporaries stay small
    chunks = zip(logits.split(LOSS_CHUNK_ROWS), target.split(LOSS_CHUNK_ROWS), strict=True)
    return sum(_SmoothedCrossEntropy.apply(x, y, float(label_smoothing)) for x, y in chunks), n_real
