"""python scripts/readme_tables.py [--check] [--readme README.md]

Writes the README's results table from the committed JSON files, between the markers
`<!-- results:begin -->` and `<!-- results:end -->`, so that no figure in it is typed by hand:

    python scripts/readme_tables.py            # rewrite the table in README.md
    python scripts/readme_tables.py --check    # exit 1 (and show the difference) when README.md's table differs

Sources, each named in the table with the command that wrote it, the machine and the date:
- docs/benchmark/benchmark.json (`python scripts/benchmark.py --peer opennmt`): training speed, test BLEU,
  decoding time and peak memory, side by side with OpenNMT-py;
- docs/study/caption_windows/study.json (`nmt-study`): BLEU by window size k, the share of its k=1 BLEU each
  model keeps, and the interaction (a model's share minus the fixed vector's, with its 95% interval). Left out,
  with no error, while the file does not exist.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BENCHMARK = ROOT / "docs" / "benchmark" / "benchmark.json"
STUDY = ROOT / "docs" / "study" / "caption_windows" / "study.json"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
SAME_RUN, SAME_STUDY = "the same run", "the same study"


def _rel(path: Path) -> str:
    """`path` relative to the repository when it is inside it (as the table names it)."""
    try:
        return path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return path.as_posix()


def command_text(command: str) -> str:
    """The recorded command with the interpreter's path shortened: `/x/.venv/bin/python scripts/...` ->
    `python scripts/...`."""
    words = command.split()
    if words and Path(words[0]).name.startswith("python"):
        words[0] = "python"
    return " ".join(words)


def machine_text(machine: dict) -> str:
    """e.g. 'AMD EPYC, AVX512, native bf16, 2 threads, torch 2.13.0+cpu' from a JSON `machine` section."""
    parts = [str(machine.get("cpu_model") or "CPU not recorded")]
    if machine.get("emulated"):  # scripts/benchmark.py --emulate-avx2: say it first, plainly
        parts[0] = (
            f"EMULATED {str(machine['emulated']).upper()} on {parts[0]} (not a real {machine['emulated']} machine)"
        )
    if machine.get("cpu_kind"):
        parts.append(f"kind {machine['cpu_kind']}")
    if machine.get("cpu_capability"):
        parts.append(str(machine["cpu_capability"]))
    if "native_bf16" in machine:
        parts.append("native bf16" if machine["native_bf16"] else "no native bf16")
    if machine.get("threads"):
        parts.append(f"{machine['threads']} thread{'s' if machine['threads'] != 1 else ''}")
    if machine.get("torch"):
        parts.append(f"torch {machine['torch']}")
    return ", ".join(parts)


def corpus_text(name: str) -> str:
    """'multi30k-de-en' -> 'Multi30k de -> en' (other names as they are)."""
    parts = name.split("-")
    if len(parts) == 3 and parts[0] == "multi30k":
        return f"Multi30k {parts[1]} -> {parts[2]}"
    return name


def source_cell(command: str | None, machine: str, date: str) -> str:
    return f"{f'`{command}`' if command else 'command not recorded'}; {machine}; {date}"


def ratio(ours: float, theirs: float) -> str:
    return f"{ours / theirs:.2f}x" if theirs else "n/a"


def benchmark_rows(bench: dict, path: Path) -> list[tuple[str, str, str]]:
    """(result, figure, source) rows of a side-by-side run of scripts/benchmark.py."""
    ours = bench["figures"]
    train, decode = bench["train"], bench["decode"]
    peer_name, peer = next(iter(bench.get("peers", {}).items()), (None, None))
    theirs = peer["figures"] if peer and peer.get("ok") else None
    label = {"opennmt": "OpenNMT-py", "joeynmt": "JoeyNMT"}.get(peer_name, peer_name)
    source = source_cell(
        command_text(bench["command"]), machine_text(bench["machine"]), f"{bench['date'][:10]} ({_rel(path)})"
    )
    corpus = corpus_text(decode.get("corpus", "multi30k-de-en"))
    sentences = decode["beam5"]["sentences"]

    def vs(key: str, fmt: str, unit: str = "") -> str:
        if theirs is None:
            return f"{fmt.format(ours[key])}{unit}"
        return f"{fmt.format(ours[key])}{unit} against {label}'s {fmt.format(theirs[key])}{unit}: " + ratio(
            ours[key], theirs[key]
        )

    rows = [
        (
            f"training on {corpus}, {train['budget_seconds']:.0f} s (`experiment=multi30k_deen`, {train['amp']})",
            f"{vs('sentences_per_s', '{:.1f}', ' sentences/s')} ({train['steps']:,} steps, "
            f"{train['epochs']:.1f} epochs)",
            source,
        ),
        (
            f"test BLEU, greedy / beam 5 (the {sentences:,} sentences of the test set, sacrebleu)",
            f"{ours['bleu_greedy']:.2f} / {ours['bleu_beam5']:.2f}"
            + (f" against {label}'s {theirs['bleu_greedy']:.2f} / {theirs['bleu_beam5']:.2f}" if theirs else ""),
            SAME_RUN,
        ),
        (
            "beam-5 decoding of the test set, decode only / whole `nmt-translate` process",
            f"{ours['decode_s_beam5']:.2f} / {ours['process_s_beam5']:.2f} s"
            + (
                f" against {label}'s {theirs['decode_s_beam5']:.2f} / {theirs['process_s_beam5']:.2f} s: "
                f"{ratio(ours['decode_s_beam5'], theirs['decode_s_beam5'])} / "
                f"{ratio(ours['process_s_beam5'], theirs['process_s_beam5'])}"
                if theirs
                else ""
            ),
            SAME_RUN,
        ),
        (
            "greedy decoding of the test set, decode only / whole process",
            f"{ours['decode_s_greedy']:.2f} / {ours['process_s_greedy']:.2f} s"
            + (
                f" against {label}'s {theirs['decode_s_greedy']:.2f} / {theirs['process_s_greedy']:.2f} s: "
                f"{ratio(ours['decode_s_greedy'], theirs['decode_s_greedy'])} / "
                f"{ratio(ours['process_s_greedy'], theirs['process_s_greedy'])}"
                if theirs
                else ""
            ),
            SAME_RUN,
        ),
        ("peak training memory (resident)", vs("peak_train_gib", "{:.2f}", " GiB"), SAME_RUN),
    ]
    return rows


# how the committed study was made (docs/study.md); study.json cannot hold it, since a rebuild from its records
# must write the same file wherever the runs were
STUDY_COMMAND = (
    "nmt-train experiment=bottleneck data.root=../shared/data/multi30k; "
    "nmt-study SWEEP --output docs/study/caption_windows"
)


def study_rows(study: dict, path: Path) -> list[tuple[str, str, str]]:
    """(result, figure, source) rows of an nmt-study summary: per model BLEU by k and the share kept, then
    each model's interaction with the fixed vector."""
    models = study.get("models") or {}
    runs = study.get("runs") or []
    machine = study.get("machine")
    if isinstance(machine, dict):
        machine_cell = machine_text(machine)
    else:  # a run recorded before checkpoints stored their CPU names the CPU that made its record
        cpus = sorted({str(r["cpu"]).split(" (recorded there")[0] for r in runs if r.get("cpu")})
        machine_cell = (", ".join(cpus) + ", 1 thread a run") if cpus else "machine not recorded"
    ended = sorted(str(r["trained_at"])[:10] for r in runs if r.get("trained_at"))
    date = (ended[0] if ended[0] == ended[-1] else f"{ended[0]}..{ended[-1]}") if ended else "date not recorded"
    command = command_text(str(study.get("command") or STUDY_COMMAND))
    source = source_cell(command, machine_cell, f"{date} ({_rel(path)})")
    trained_k = study.get("trained_k")
    rows = []
    for key, m in models.items():
        by_k = m.get("bleu_by_k") or {}
        if not by_k:
            continue
        ks = sorted(by_k, key=int)
        beyond = [k for k in ks if trained_k is not None and int(k) > int(trained_k)]
        figure = " / ".join(f"{by_k[k]:.1f}" for k in ks)
        if beyond:
            figure += f" (k={', '.join(beyond)}: longer than any training example)"
        if m.get("ratio") is not None:
            figure += f"; keeps {m['ratio']:.2f} of its k=1 BLEU at k={m.get('ratio_k', ks[-1])}"
        seeds = m.get("seeds")
        extra = [f"{seeds} seed{'s' if seeds != 1 else ''}"] if seeds else []
        if m.get("train_minutes") is not None:
            extra.append(f"{m['train_minutes']:.0f} min of training a run")
        result = f"bottleneck study, {m.get('label', key)}: test BLEU at k = {ks[0]}..{ks[-1]} captions"
        rows.append((result + (f" ({', '.join(extra)})" if extra else ""), figure, source if not rows else SAME_STUDY))
    for key, x in (study.get("interaction") or {}).items():
        if "difference" not in x:
            continue
        lo, hi = x.get("ci95", (None, None))
        interval = f" [{lo:+.3f}, {hi:+.3f}]" if lo is not None else ""
        rows.append(
            (
                f"interaction: share of k=1 BLEU kept at k={x.get('k', '?')}, {key} minus none (95% interval)",
                f"{x['difference']:+.3f}{interval}",
                source if not rows else SAME_STUDY,
            )
        )
    return rows


def render(benchmark: Path = BENCHMARK, study: Path = STUDY) -> str:
    """The block between (and with) the markers, from the JSON files; a missing study file is left out."""
    rows = study_rows(json.loads(study.read_text(encoding="utf-8")), study) if study.exists() else []
    rows += benchmark_rows(json.loads(benchmark.read_text(encoding="utf-8")), benchmark)
    lines = [
        BEGIN,
        "<!-- written by scripts/readme_tables.py from the JSON files it names; edit those, not this table -->",
        "",
        "| result | figure | command; machine; date (file) |",
        "|---|---|---|",
        *(f"| {a} | {b} | {c} |" for a, b, c in rows),
        "",
        END,
    ]
    return "\n".join(lines)


def replace_block(text: str, block: str) -> str:
    """`text` with its results block (markers included) replaced by `block`."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"readme_tables: error: the markers {BEGIN} ... {END} are missing from the README")
    return text[:start] + block + text[end + len(END) :]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[1], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when the README's table differs; write nothing")
    parser.add_argument("--readme", type=Path, default=README)
    parser.add_argument("--benchmark", type=Path, default=BENCHMARK)
    parser.add_argument("--study", type=Path, default=STUDY)
    args = parser.parse_args(argv)
    text = args.readme.read_text(encoding="utf-8")
    new = replace_block(text, render(args.benchmark, args.study))
    if args.check:
        if new != text:
            sys.stdout.writelines(
                difflib.unified_diff(
                    text.splitlines(True), new.splitlines(True), str(args.readme), "scripts/readme_tables.py"
                )
            )
            print(f"{args.readme}: the results table differs from the JSON files; run python scripts/readme_tables.py")
            return 1
        return 0
    if new != text:
        args.readme.write_text(new, encoding="utf-8")
        print(f"{args.readme}: results table written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
