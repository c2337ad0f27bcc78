"""nmt-study: compare the runs of a study (e.g. `nmt-train experiment=bottleneck`) as their inputs grow.

    nmt-study multirun/2024-05-01/12-00-00                     # every run under the sweep directory
    nmt-study docs/study/caption_windows/records               # the same study from its records alone
    nmt-study SWEEP old/records/none_seed4.json.gz --output docs/study/x   # runs and records, mixed
    nmt-study SWEEP --beam 1                                   # greedy only (faster; default: --beam 1,5)

Each run directory's checkpoints/best.pt translates the test split and, where the corpus has them (data.window),
its windows test_k1..test_kK: the same test items joined k at a time, in windows of exactly k (the last n mod k
items left out and counted). Every run is decoded greedily and with beam 5 (--beam 1,5, the default; --beam 1:
greedy only). What it translated and how it trained go into one record per run, <output>/records/<run>.json.gz;
every table, plot and test is then built from records alone, so records made on other days and machines combine
(version-1 records, greedy only, too), and a study rebuilt from its records equals the original file for file.
Runs must differ only in the attention and the seed (paths, threads and logging may differ); the seeds are
paired by the seed each run recorded. Per decoding (headline: greedy, which every record has; a decoding only
some seeds have is reported on those, each row naming its number of seeds) and per k: each model's seed-mean
BLEU with a 95% t-interval over the seeds and a 95% interval over draws of that k's windows (Bible: chapters),
a paired bootstrap test against attention=none for every seed on those draws (significant only when every seed
agrees in sign; Holm-corrected over every k and model), and the interaction: each model's ratio BLEU(k=K) /
BLEU(k=1) minus none's, with 95% intervals over the seeds and over blocks of K captions. The output directory
receives records/, study.md, study.json, bleu_by_window.png (and bleu_by_window_beam5.png), bleu_by_length.png,
learning_curves.png and attention_long.png; the tables are printed. The training split, the split that chose
each checkpoint (valid and its windows) and a split given twice are refused.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from nmt.cli.common import build_corpus, user_errors
from nmt.cli.interrupt import running
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
        metavar="SWEEP_DIR_RUN_DIR_OR_RECORD",
        help="a multirun directory (its subdirectories with checkpoints/best.pt), run directories, records "
        "(*.json.gz) or a directory of records",
    )
    parser.add_argument(
        "--split",
        default="test",
        help="held-out split to study (default: test), with its windows <split>_k<k> where the corpus has them; "
        "train, valid and valid_k<k> are refused (valid chose each run's best.pt)",
    )
    parser.add_argument(
        "--buckets",
        default=None,
        help="source-length bucket edges in words, e.g. 0,15,25,35 (default: chosen from the data)",
    )
    parser.add_argument(
        "--min-bucket", type=int, default=80, help="items every automatically chosen bucket must hold (default: 80)"
    )
    parser.add_argument(
        "--beam",
        default="1,5",
        help="beam sizes the runs recorded now are decoded with, separated by commas (default: 1,5: greedy and "
        "beam 5; 1: greedy only); records made before are used as they are",
    )
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda (default: auto)")
    parser.add_argument(
        "--bootstrap",
        type=int,
        default=1000,
        help="resamples for every interval and paired test, at least 1000 (default: 1000; the smallest p-value "
        "is then 1/1001, printed rounded up as 0.001)",
    )
    parser.add_argument(
        "--seed", type=int, default=12345, help="the resampling seed, recorded in study.json (default: 12345)"
    )
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: all)")
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        help="where the study files go (default: the sweep directory, or the folder above a records/ directory)",
    )
    return parser.parse_args(argv)


def parse_beams(text: str) -> tuple[int, ...]:
    """--beam 1,5 -> (1, 5): beam sizes of at least 1, each once, in order."""
    try:
        beams = sorted({int(x) for x in text.split(",")})
    except ValueError:
        raise ConfigError(f"--beam {text}: give beam sizes separated by commas, e.g. 1,5") from None
    if not beams or beams[0] < 1:
        raise ConfigError(f"--beam {text}: beam sizes must be at least 1 (1: greedy)")
    return tuple(beams)


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
    from nmt.study import RecordSettings, StudySettings, check_split, run_study

    if args.min_bucket < 1:
        raise ConfigError("--min-bucket must be at least 1")
    beams = parse_beams(args.beam)
    edges = parse_edges(args.buckets)
    if edges is not None:
        check_edges(edges, "--buckets")
    if args.threads:
        torch.set_num_threads(args.threads)
    settings = StudySettings(
        split=check_split(args.split),
        edges=edges,
        min_bucket=args.min_bucket,
        bootstrap=args.bootstrap,
        seed=args.seed,
        record=RecordSettings(device=resolve_device(args.device, "--device "), beams=beams),
    )
    return run_study(args.paths, load_corpus, args.output, settings)


def main(argv: list[str] | None = None) -> None:
    with running("nmt-study"):  # Ctrl-C: one line, exit 130 (nmt.cli.interrupt)
        _main(argv)


def _main(argv: list[str] | None) -> None:
    from nmt.study.tables import decoding_text, interaction_markdown, paired_markdown, windows_markdown

    args = parse_args(argv)
    with user_errors():
        summary = run(args)
    for decoding, res in summary["results"].items():
        text = decoding_text(decoding) + (" (headline)" if decoding == summary["headline"] else "")
        print(f"{text}: BLEU by window size k (seed mean [95% t-interval over the seeds]):\n")
        print(windows_markdown(summary, decoding))
        if res["interaction"]:
            print(f"{text}: ratio BLEU(k=K) / BLEU(k=1) against none's:\n\n" + interaction_markdown(summary, decoding))
        if res["paired"]:
            print(f"{text}: paired tests against none:\n\n" + paired_markdown(summary, decoding))
    for note in summary["notes"]:
        print(f"- {note}")
    out = Path(args.output) if args.output else None
    where = out or "the output directory"
    print(f"\nwritten to {where}: records/, " + ", ".join(summary["files"].values()))


if __name__ == "__main__":
    main()
