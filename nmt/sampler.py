"""Which training sentences go together: token batches of similar length, in a seeded order, dealt to the ranks.

sampler = TokenBatchSampler(split.src_lengths, split.tgt_lengths, batch_tokens, seed, bucketing="exact")
for indices in sampler.batches(epoch): batch = collate(split, indices)   # nmt.data.collate
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import torch

from nmt.choices import Bucketing, choice

if TYPE_CHECKING:
    from nmt.data import EncodedSplit


class TokenBatchSampler:
    """Batches of similar-length sentences whose padded size stays under `batch_tokens`.

    Each epoch: shuffle (seeded by seed + epoch), sort by length in chunks of `sort_pool` batches so
    neighbours have similar lengths, cut into batches where `n * max(src_len, tgt_len) <= batch_tokens`,
    then shuffle the batch order. The same seed and epoch always give the same batches.

    `bucketing="exact"` first groups the sentences by source length, so a batch's sources share one length:
    the encoder then needs neither padding nor packing (the fastest LSTM path, and the one where bf16 pays).
    Targets are sorted within each group the same way. The end of a group that would make a batch under
    half of `batch_tokens` is merged with the start of the next length instead (on a CPU the encoder then runs
    once per source length, nmt.encoder; elsewhere the batch is packed).
    `bucketing="sorted"` mixes lengths.

    Within a batch the sentences come longest target first: the teacher-forced decoder loop then computes
    only the sentences whose target has not yet ended (nmt.decoder.active_rows).

    With `world_size > 1` (DistributedDataParallel), each global batch is dealt round-robin to the ranks:
    rank r trains on sentences r, r + world, ... of every batch, so every rank takes the same number of
    steps, the ranks' shards are disjoint, and together they cover every sentence once per epoch.
    """

    MERGE_BELOW = 0.5  # exact: a batch under this fraction of batch_tokens goes on into the next length

    def __init__(
        self,
        src_lengths: torch.Tensor,
        tgt_lengths: torch.Tensor,
        batch_tokens: int,
        seed: int,
        shuffle: bool = True,
        rank: int = 0,
        world_size: int = 1,
        sort_pool: int = 100,
        bucketing: Bucketing = Bucketing.exact,
    ):
        bucketing = choice(Bucketing, bucketing, "trainer.bucketing")
        self.src_lengths, self.tgt_lengths = src_lengths.tolist(), tgt_lengths.tolist()
        self.lengths = torch.maximum(src_lengths, tgt_lengths).tolist()
        self.batch_tokens, self.seed, self.shuffle = batch_tokens, seed, shuffle
        self.rank, self.world_size, self.sort_pool = rank, world_size, sort_pool
        self.exact = bucketing == "exact"

    def _order(self, rng: random.Random) -> list[int]:
        """Every index once, neighbours of similar length (and, if exact, runs of one source length)."""
        order = list(range(len(self.lengths)))
        if not self.shuffle:
            key = (lambda i: (self.src_lengths[i], self.lengths[i])) if self.exact else self.lengths.__getitem__
            return sorted(order, key=key)
        rng.shuffle(order)
        if self.exact:
            order.sort(key=self.src_lengths.__getitem__)  # stable: each group stays shuffled
        mean_len = max(1, sum(self.lengths) // max(1, len(self.lengths)))
        pool = self.sort_pool * max(1, self.batch_tokens // mean_len)
        groups = [order]
        if self.exact:
            groups, start = [], 0
            for k in range(1, len(order) + 1):
                if k == len(order) or self.src_lengths[order[k]] != self.src_lengths[order[start]]:
                    groups.append(order[start:k])
                    start = k
        chunks = [g[i : i + pool] for g in groups for i in range(0, len(g), pool)]
        return [i for chunk in chunks for i in sorted(chunk, key=self.lengths.__getitem__)]

    def global_batches(self, epoch: int) -> list[list[int]]:
        """All batches of `epoch` before sharding."""
        rng = random.Random(self.seed * 100_003 + epoch)
        batches, current, longest = [], [], 0
        for i in self._order(rng):
            n_longest = max(longest, self.lengths[i])
            full = n_longest * (len(current) + 1) > self.batch_tokens
            # exact: a new source length closes a batch that is at least half full; a smaller one (the end
            # of a length's group) takes the next length's sentences rather than training as a tiny batch
            new_length = self.exact and current and self.src_lengths[i] != self.src_lengths[current[-1]]
            new_length = new_length and longest * len(current) >= self.batch_tokens * self.MERGE_BELOW
            if current and (full or new_length) and len(current) >= self.world_size:
                batches.append(current)
                current, n_longest = [], self.lengths[i]
            current.append(i)
            longest = n_longest
        if current and batches and len(current) < self.world_size:
            batches[-1].extend(current)  # every rank needs at least one sentence of every batch
        elif current:
            batches.append(current)
        # longest target first (stable), on every rank: the decoder loop drops sentences as they end
        batches = [sorted(b, key=self.tgt_lengths.__getitem__, reverse=True) for b in batches]
        if self.shuffle:
            rng.shuffle(batches)
        return batches

    def batches(self, epoch: int) -> list[list[int]]:
        """This rank's batches of `epoch`."""
        return [b[self.rank :: self.world_size] for b in self.global_batches(epoch)]

    def __len__(self) -> int:
        return len(self.global_batches(0))


def padding_overhead(split: EncodedSplit, batches: list[list[int]]) -> tuple[int, int]:
    """(real tokens, padded tokens) over source and target of `batches`."""
    real = padded = 0
    for b in batches:
        sl, tl = split.src_lengths[b], split.tgt_lengths[b]
        real += int(sl.sum() + tl.sum())
        padded += len(b) * int(sl.max() + tl.max())
    return real, padded
