"""nmt-study: compare the runs of a sweep (e.g. `nmt-train experiment=bottleneck`) by source length.

    nmt-study multirun/2024-05-01/12-00-00                  # every run under the sweep directory
    nmt-study runs/none runs/luong --split valid+test        # run directories trained separately
    nmt-study SWEEP --buckets 0,15,25,35 --beam 5 --output docs/study

Each run's checkpoints/best.pt is evaluated on the split (or valid+test, concatenated) as nmt-evaluate
does, writing <run>/eval/; the sweep directory (or --output) receives study.md, study.json,
bleu_by_length.png, learning_curves.png and attention_long_sentence.png. The table is printed.
Buckets default to the finest candidate edges with at least --min-bucket sentences in every bucket.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from nmt.cli.common import build_corpus, user_errors
from nmt.device import resolve_device
from nmt.errors import ConfigError


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="nmt-study", description=__doc__.split(": ", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=Path, metavar="SWEEP_DIR_OR_RUN_DIR",
                        help="a multirun directory (its subdirectories with checkpoints/best.pt) "
                             "or run directories")
    parser.add_argument("--split", default="test",
                        help="split to evaluate on; join splits with + to concatenate them (default: test)")
    parser.add_argument("--buckets", default=None,
                        help="source-length bucket edges in words, e.g. 0,15,25,35 "
                             "(default: chosen from the data)")
    parser.add_argument("--min-bucket", type=int, default=80,
                        help="sentences every automatically chosen bucket must hold (default: 80)")
    parser.add_argument("--beam", type=int, default=1, help="beam size (default: 1, greedy)")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda (default: auto)")
    parser.add_argument("--bootstrap", type=int, default=1000,
                        help="bootstrap resamples per bucket for the 95%% intervals; 0: none (default: 1000)")
    parser.add_argument("--heatmaps", type=int, default=4, help="heatmaps per run in <run>/eval (default: 4)")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: all)")
    parser.add_argument("--output", type=Path, default=None,
                        help="where the study files go (default: the sweep directory)")
    return parser.parse_args(argv)


def parse_edges(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise ConfigError(f"--buckets {text}: give word counts separated by commas, "
                          "e.g. 0,15,25,35") from None


def load_corpus(config: dict):
    """The corpus a run was trained on, from its stored config (as nmt-evaluate rebuilds it)."""
    from omegaconf import OmegaConf

    return build_corpus(OmegaConf.create(config["data"]), config.get("paths", {}).get("data_dir", "data"))


def run(args: argparse.Namespace) -> dict:
    import torch

    from nmt.study import StudySettings, check_edges, run_study

    if args.beam < 1 or args.bootstrap < 0 or args.min_bucket < 1 or args.heatmaps < 0:
        raise ConfigError("--beam and --min-bucket must be at least 1, --bootstrap and --heatmaps at least 0")
    edges = parse_edges(args.buckets)
    if edges is not None:
        check_edges(edges)
    if args.threads:
        torch.set_num_threads(args.threads)
    settings = StudySettings(splits=args.split.split("+"), edges=edges, min_bucket=args.min_bucket,
                             bootstrap=args.bootstrap, heatmaps=args.heatmaps,
                             device=resolve_device(args.device, "--device "), decoding={"beam_size": args.beam})
    return run_study(args.paths, load_corpus, args.output, settings)


def main(argv: list[str] | None = None) -> None:
    from nmt.study_report import table_markdown

    args = parse_args(argv)
    with user_errors():
        summary = run(args)
    print(table_markdown(summary))
    for note in summary["notes"]:
        print(f"- {note}")
    print(f"\nwritten to {Path(summary['files']['md']).parent}: study.md, study.json, bleu_by_length.png, "
          "learning_curves.png, attention_long_sentence.png (per-run files in <run>/eval)")


if __name__ == "__main__":
    main()
