"""python scripts/average_check.py --data DIR [--decays 0.99,0.995,0.998] [--work DIR] [--out FILE] [K=V ...]

What averaging the weights (trainer.average_decay, nmt/averaging.py) is worth for the multi30k_deen preset on this
machine: one training run of scripts/benchmark.py's settings (720 s, no periodic validation) with the preset's
averaging off, keeping the average at each of --decays beside it (nmt.averaging.WeightAverage, as the Trainer
does), then beam-5 BLEU on the validation and test sets of the last weights and of each average. The run is one
seed: choose a decay on the validation set, read the test set's figures only for the chosen one.

    python scripts/average_check.py --data ../shared/data/multi30k --out docs/benchmark/average_check.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import nmt.cli  # noqa: F401  (sets the CPU memory settings of nmt/memory.py: must come before torch)

# isort: split
import torch

sys.path.insert(0, str(Path(__file__).parent))
import benchmark  # noqa: E402  (scripts/benchmark.py: the same training settings and decoding)

from nmt.averaging import WeightAverage  # noqa: E402
from nmt.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from nmt.memory import tune_for_decoding  # noqa: E402
from nmt.provenance import describe_machine  # noqa: E402
from nmt.trainer import Trainer, TrainerHook  # noqa: E402


class Averages(TrainerHook):
    """One WeightAverage per decay, updated after every step the Trainer takes."""

    def __init__(self, decays: list[float]):
        self.decays, self.averages, self.module = decays, {}, None

    def on_step(self, trainer: Trainer, seconds: float, sentences: int, tokens: int, skipped: bool) -> None:
        if not self.averages:  # from the first step's weights (the Trainer's: the initial ones; nil after 100 steps)
            self.module = trainer.module
            self.averages = {d: WeightAverage(trainer.module, d) for d in self.decays}
        if not skipped:
            for average in self.averages.values():
                average.update(trainer.module, trainer.step)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[1], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", required=True, help="the Multi30k directory (../shared/data/multi30k)")
    p.add_argument("--decays", default="0.99,0.995,0.998", help="the averages kept, comma-separated")
    p.add_argument("--train-seconds", type=float, default=720.0, help="training wall-clock budget (default 720)")
    p.add_argument("--work", default=None, help="run directory and checkpoints (default: a new temporary one)")
    p.add_argument("--out", default="average_check.json", help="the JSON written")
    p.add_argument("overrides", nargs="*", help="config overrides after the benchmark's (K=V)")
    args = p.parse_args(argv)
    decays = [float(d) for d in args.decays.split(",")]
    work = Path(args.work or tempfile.mkdtemp(prefix="nmt-average-")).resolve()
    overrides = ["trainer.average_decay=null", *args.overrides]  # the last weights in last.pt; the averages here
    bench_args = benchmark.parse_args(["--data", args.data, "--train-seconds", str(args.train_seconds), *overrides])
    cfg, _ = benchmark.benchmark_config(bench_args, work)
    torch.set_num_threads(bench_args.threads)
    hook = Averages(decays)
    report, checkpoint, data = benchmark.train(cfg, work / "run", "cpu", hooks=[hook])
    tune_for_decoding()
    payload = load_checkpoint(checkpoint)
    checkpoints = {"weights": checkpoint}
    for decay, average in hook.averages.items():
        checkpoints[f"average {decay}"] = path = work / f"average_{decay}.pt"
        save_checkpoint(path, {**payload, "model": average.state(hook.module)["model"]})
    result = {"command": " ".join([sys.executable, *sys.argv]), "machine": describe_machine(bench_args.threads)}
    result["train"] = {k: report[k] for k in ("steps", "sentences_per_s", "epochs", "train_seconds")}
    for split in ("valid", benchmark.TEST_SPLIT):
        pairs = data.corpus.splits[split]
        sources, references = [s for s, _ in pairs], [t for _, t in pairs]
        for label, path in checkpoints.items():
            scores, _ = benchmark.decode_only(path, sources, references, 5, "cpu")
            result.setdefault(label, {})[f"{split}_bleu_beam5"] = scores["bleu"]
            print(f"{label:>16} {split:>5} BLEU {scores['bleu']:.2f}", flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
