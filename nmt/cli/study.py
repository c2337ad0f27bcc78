"""nmt-study: compare the runs of a sweep (e.g. `nmt-train experiment=bottleneck`) by source length.

    nmt-study multirun/2024-05-01/12-00-00                  # every run under the sweep directory
    nmt-study runs/none runs/luong --buckets 0,15,25,35      # run directories trained separately
    nmt-study SWEEP --beam 5 --bootstrap 2000 --output docs/study

Each run's checkpoints/best.pt is evaluated on the test split as nmt-evaluate does, writing <run>/eval/;
when the corpus has verse windows (test_k1..test_kK, from data.window=K) every test_k<k> set is evaluated
too. Runs that differ only in the seed form a group: per bucket (and per k) its seed mean BLEU with a 95%
interval over seeds x sentences, and a paired bootstrap test (sacrebleu) against the attention=none group,
seed by seed. The valid split is refused: it chose each run's best.pt. The sweep directory (or --output)
receives study.md, study.json, bleu_by_length.png, bleu_by_window.png (with windows), learning_curves.png
and attention_long_sentence.png. The tables are printed.
Buckets default to the finest candidate edges with at least --min-bucket sentences in every bucket.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from nmt.cli.common import build_corpus, user_errors
from nmt.device import resolve_device
from nmt.errors import ConfigError


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="nmt-study", description=__doc__.split(": ", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "paths",
        nargs="+",
        type=Path,
        metavar="SWEEP_DIR_OR_RUN_DIR",
        help="a multirun directory (its subdirectories with checkpoints/best.pt) or run directories",
    )
    parser.add_argument(
        "--split",
        default="test",
        help="held-out split to evaluate on (default: test; join splits with + to concatenate "
        "them); valid and valid_k<k> are refused, since valid chose each run's best.pt",
    )
    parser.add_argument(
        "--buckets",
        default=None,
        help="source-length bucket edges in words, e.g. 0,15,25,35 (default: chosen from the data)",
    )
    parser.add_argument(
        "--min-bucket", type=int, default=80, help="sentences every automatically chosen bucket must hold (default: 80)"
    )
    parser.add_argument("--beam", type=int, default=1, help="beam size (default: 1, greedy)")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda (default: auto)")
    parser.add_argument(
        "--bootstrap",
        type=int,
        default=1000,
        help="bootstrap replicates for the 95%% intervals (seeds x sentences) and resamples for "
        "the paired tests against none; 0: neither (default: 1000)",
    )
    parser.add_argument("--heatmaps", type=int, default=4, help="heatmaps per run in <run>/eval (default: 4)")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: all)")
    parser.add_argument(
        "--output", type=Path, default=None, help="where the study files go (default: the sweep directory)"
    )
    return parser.parse_args(argv)


def parse_edges(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise ConfigError(f"--buckets {text}: give word counts separated by commas, e.g. 0,15,25,35") from None


def load_corpus(config: dict):
    """The corpus a run was trained on, from its stored config (as nmt-evaluate rebuilds it)."""
    from omegaconf import OmegaConf

    return build_corpus(OmegaConf.create(config["data"]), config.get("paths", {}).get("data_dir", "data"))


def run(args: argparse.Namespace) -> dict:
    import torch

    from nmt.metrics import check_edges
    from nmt.study import StudySettings, check_splits, run_study

    if args.beam < 1 or args.bootstrap < 0 or args.min_bucket < 1 or args.heatmaps < 0:
        raise ConfigError("--beam and --min-bucket must be at least 1, --bootstrap and --heatmaps at least 0")
    splits = check_splits(args.split.split("+"))
    edges = parse_edges(args.buckets)
    if edges is not None:
        check_edges(edges, "--buckets")
    if args.threads:
        torch.set_num_threads(args.threads)
    settings = StudySettings(
        splits=splits,
        edges=edges,
        min_bucket=args.min_bucket,
        bootstrap=args.bootstrap,
        heatmaps=args.heatmaps,
        device=resolve_device(args.device, "--device "),
        decoding={"beam_size": args.beam},
    )
    return run_study(args.paths, load_corpus, args.output, settings)


def main(argv: list[str] | None = None) -> None:
    from nmt.study_report import table_markdown, tests_markdown, windows_markdown

    args = parse_args(argv)
    with user_errors():
        summary = run(args)
    print(table_markdown(summary))
    if summary.get("windows"):
        print("By window size (the same test verses, k at a time):\n" + windows_markdown(summary))
    if tests_markdown(summary):
        print("Paired tests against none (BLEU difference, largest p over seed pairs):\n" + tests_markdown(summary))
    for note in summary["notes"]:
        print(f"- {note}")
    files = ", ".join(Path(f).name for f in summary["files"].values())
    print(f"\nwritten to {Path(summary['files']['md']).parent}: {files} (per-run files in <run>/eval)")


if __name__ == "__main__":
    main()
