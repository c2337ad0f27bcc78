"""python scripts/step_benchmark.py [--steps 40] [--threads 2] [VARIANT ...] [-- KEY=VALUE ...]

Training-step throughput of the `multi30k_deen` preset under the speed-related settings, one variant after
another on the same batches, so you can see what each setting buys on your machine:

    python scripts/step_benchmark.py                       # every variant below
    python scripts/step_benchmark.py fp32-sorted bf16-exact --steps 80
    python scripts/step_benchmark.py -- data.root=../shared/data/multi30k model.hidden_size=256
    python scripts/step_benchmark.py fp32-exact-nofeed --data '' -- experiment=bottleneck_bible hydra.mode=RUN \
        attention=bahdanau data.window=4                  # long inputs: windows of 1-4 Bible verses
    python scripts/step_benchmark.py fp32-exact-nofeed --min-source 100 --data '' -- experiment=bottleneck_bible \
        hydra.mode=RUN attention=bahdanau data.window=4   # the long windows only: sources of 100+ pieces

Variants (trainer.amp / trainer.bucketing / model.input_feeding):
    fp32-sorted        off  / sorted / true     the plain baseline
    fp32-exact         off  / exact  / true
    bf16-sorted        bf16 / sorted / true
    bf16-exact         bf16 / exact  / true     the preset's settings on a CPU with bf16 (AVX-512 BF16, AMX)
    bf16-exact-nofeed  bf16 / exact  / false    the decoder as one nn.LSTM call (a different model)
    fp32-exact-nofeed  off  / exact  / false    the same in fp32 (not run unless named)

Each variant builds the model from the same seed, warms up for 3 batches and then times --steps optimizer
steps (forward, loss, backward, clipping, Adam) of the batches of epoch 0, then epoch 1, and so on, in
training's order, without validation or logging. The multi30k_deen preset has 265 batches per epoch:
--steps beyond that measures what a long run sees, batch shapes met again (compiled kernels reused or
compiled again). It prints sentences/s, target tokens/s and the tokens/s ratio to the first variant run
(the two bucketings cut different batches, so their first batches hold different numbers of sentences:
compare tokens/s); --out writes JSON, with the batches' mean source length and sentences per batch.
--min-source N times the training examples whose source has at least N pieces only, cut into batches of the
same batch_tokens by the sampler nmt-train uses (each epoch's long windows, say).
This measures steps only; scripts/benchmark.py measures whole runs, decoding and BLEU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import nmt.cli  # noqa: F401  (sets the CPU memory settings of nmt/memory.py: must come before torch)

# isort: split
import torch

from nmt.cli.common import build_run, compose_config, load_data, user_errors
from nmt.data import EncodedSplit, collate
from nmt.loss import loss_rows
from nmt.memory import VARIABLES, tune_allocator
from nmt.provenance import describe_machine
from nmt.sampler import TokenBatchSampler
from nmt.special import PAD_ID

VARIANTS = {  # name: (amp, bucketing, input_feeding)
    "fp32-sorted": ("off", "sorted", True),
    "fp32-exact": ("off", "exact", True),
    "bf16-sorted": ("bf16", "sorted", True),
    "bf16-exact": ("bf16", "exact", True),
    "bf16-exact-nofeed": ("bf16", "exact", False),
    "fp32-exact-nofeed": ("off", "exact", False),
}
WARMUP = 3


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    overrides = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[1], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("variants", nargs="*", metavar="VARIANT", help=f"any of {', '.join(VARIANTS)} (default: all)")
    p.add_argument("--steps", type=int, default=40, help="timed optimizer steps per variant (default 40)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    p.add_argument(
        "--data",
        default="../shared/data/multi30k",
        help="the Multi30k raw files (data.root); '' when an override picks another corpus",
    )
    p.add_argument("--out", help="also write the results as JSON to this file")
    p.add_argument(
        "--min-source",
        type=int,
        default=0,
        metavar="N",
        help="time only training examples whose source has at least N pieces (default: all)",
    )
    args = p.parse_args(argv)
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        p.error(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    if args.steps < 1 or args.threads < 1 or args.min_source < 0:
        p.error("--steps and --threads must be positive, --min-source at least 0")
    return args, overrides


def long_examples(split: EncodedSplit, sampler: TokenBatchSampler, min_source: int):
    """The examples of `split` whose source has at least `min_source` pieces, and a sampler like `sampler`
    (the same batch_tokens, seed and bucketing) over them."""
    keep = (split.src_lengths >= min_source).nonzero().flatten().tolist()
    if not keep:
        raise SystemExit(f"--min-source {min_source}: no training example has a source that long")
    long = EncodedSplit([split.source(i).tolist() for i in keep], [split.target(i).tolist() for i in keep])
    bucketing = "exact" if sampler.exact else "sorted"
    return long, TokenBatchSampler(
        long.src_lengths, long.tgt_lengths, sampler.batch_tokens, sampler.seed, bucketing=bucketing
    )


def time_variant(cfg, data, steps: int, work: Path, min_source: int = 0) -> dict:
    """Sentences/s and target tokens/s over `steps` optimizer steps after a short warm-up, with the model,
    optimizer, batches and autocast of the Trainer that nmt-train would build from `cfg` (only the examples
    with sources of `min_source` pieces or more, when given)."""
    trainer = build_run(cfg, work, "cpu", data)
    model, optimizer, tcfg = trainer.module.train(), trainer.optimizer, trainer.cfg
    batches, epoch = [], 0  # epoch 0's batches, then epoch 1's, ...: as in training, shapes come back
    while len(batches) < WARMUP + steps:
        trainer.use_epoch(epoch)  # that epoch's examples (new verse windows when data.window > 1)
        split, sampler = trainer.train_split, trainer.sampler
        if min_source:
            split, sampler = long_examples(split, sampler, min_source)
        batches += [(split, b) for b in sampler.batches(epoch)]
        epoch += 1
    batches = batches[: WARMUP + steps]
    timed = batches[WARMUP:]
    source_pieces = sum(int(split.src_lengths[b].sum()) for split, b in timed)
    sentences = tokens = 0
    start = 0.0
    for i, (split, indices) in enumerate(batches):
        if i == WARMUP:
            start = time.perf_counter()
        batch = collate(split, indices)
        optimizer.zero_grad(set_to_none=True)
        rows = loss_rows(batch.tgt_out)
        loss, n = trainer.batch_loss(batch, rows), int((batch.tgt_out != PAD_ID).sum())  # the Trainer's loss
        (loss / n).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tcfg.clip_norm)
        optimizer.step()
        if i >= WARMUP:
            sentences, tokens = sentences + len(indices), tokens + n
    seconds = time.perf_counter() - start
    return {
        "amp": tcfg.amp,
        "bucketing": tcfg.bucketing,
        "input_feeding": model.config.input_feeding,
        "steps": len(batches) - WARMUP,
        "seconds": round(seconds, 3),
        "sentences_per_s": round(sentences / seconds, 1),
        "target_tokens_per_s": round(tokens / seconds, 1),
        "mean_source_pieces": round(source_pieces / sentences, 1),
        "sentences_per_batch": round(sentences / len(timed), 1),
    }


def main(argv: list[str] | None = None) -> int:
    args, overrides = parse_args(argv)
    torch.set_num_threads(args.threads)
    root = [f"data.root={Path(args.data).resolve()}"] if args.data else []
    base = ["experiment=multi30k_deen", *root, "trainer.progress=false", f"trainer.threads={args.threads}", *overrides]
    data = load_data(compose_config(base))
    names = args.variants or [v for v in VARIANTS if v != "fp32-exact-nofeed"]
    configs = {
        name: compose_config(
            [
                *base,
                f"trainer.amp={VARIANTS[name][0]}",
                f"trainer.bucketing={VARIANTS[name][1]}",
                f"model.input_feeding={VARIANTS[name][2]}",
            ]
        )
        for name in names
    }
    results, first = {}, None
    print(f"{'variant':20s} {'sent/s':>8s} {'tok/s':>8s} {'ratio':>6s}")
    work = Path(tempfile.mkdtemp(prefix="nmt-steps-"))  # the Trainers' run directory (nothing is written)
    for name in names:
        r = time_variant(configs[name], data, args.steps, work, args.min_source)
        first = first or r["target_tokens_per_s"]
        r["ratio"] = round(r["target_tokens_per_s"] / first, 3)  # tokens, not sentences: batches differ by bucketing
        results[name] = r
        print(f"{name:20s} {r['sentences_per_s']:8.1f} {r['target_tokens_per_s']:8.0f} {r['ratio']:6.2f}", flush=True)
    if args.out:
        report = {
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "threads": args.threads,
            "min_source": args.min_source,
            "overrides": overrides,
            "torch": torch.__version__,
            "machine": describe_machine(args.threads),
            "allocator": tune_allocator(),  # what nmt/memory.py set (the user's variables win)
            "environment": {k: os.environ.get(k) for k in VARIABLES},
            "results": results,
        }
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    with user_errors():  # a missing corpus or a bad override: one line, not a traceback
        sys.exit(main())
