"""nmt-prepare: read and check a corpus, train (or reuse) its tokenizer, encode and cache it, print a summary.

nmt-prepare                                   # the default Bible corpus, German -> English
nmt-prepare data=multi30k data.root=../shared/data/multi30k
nmt-prepare data=files data.train=corpus.tsv
"""

from __future__ import annotations

import statistics

import hydra
from omegaconf import DictConfig

from nmt.cli.common import CONFIG_DIR, load_data, user_errors
from nmt.cli.strict import strict_keys


def summarize(data) -> str:
    """Pairs per split, drops by reason, length percentiles and vocabulary sizes, as printable text."""
    tok = data.tokenizer
    lines = [f"corpus {data.corpus.name} ({data.corpus.src_lang} -> {data.corpus.tgt_lang})"]
    for split, enc in data.encoded.items():
        lines.append(f"  {split:<18} {len(enc):>8,} pairs")
    if data.dropped:
        lines.append("dropped:")
        lines += [f"  {reason:<40} {n:>6,}" for reason, n in data.dropped.items()]
    train = data.pairs("train")
    words = sorted(len(s.split()) for s, _ in train)
    if words:
        q = statistics.quantiles(words, n=100) if len(words) > 1 else [words[0]] * 99
        lines.append(
            f"train source words: mean {statistics.mean(words):.1f}, median {q[49]:.0f}, "
            f"p90 {q[89]:.0f}, p99 {q[98]:.0f}, max {words[-1]}"
        )
        pieces = data.encoded["train"].src_lengths.float()
        lines.append(f"train source pieces (with EOS): mean {pieces.mean():.1f}, max {int(pieces.max())}")
    joint = "joint" if tok.joint else "separate"
    lines.append(f"vocabulary ({joint}): source {tok.src_vocab_size:,}, target {tok.tgt_vocab_size:,} pieces")
    lines.append(f"cache: {data.cache_dir}")
    return "\n".join(lines)


@strict_keys("prepare")  # a misspelt key, with or without +: one line, exit 2 (nmt.cli.strict)
@hydra.main(config_path=CONFIG_DIR, config_name="prepare", version_base="1.3")
def main(cfg: DictConfig) -> None:
    with user_errors():
        print(summarize(load_data(cfg)))


if __name__ == "__main__":
    main()
