"""python scripts/readme_tables.py [--check] [--readme README.md] [--study-doc docs/study.md] [--perf-doc ...]
       [--serving-doc ...]

Writes the tables and figures of the docs from the committed JSON files, so that no figure in them is typed by
hand: the README's results table (between `<!-- results:begin -->` and `<!-- results:end -->`), its first run and
the suite's time, the bottleneck study's tables of both language pairs side by side, in the README (compact) and
in docs/study.md (every decoding), between `<!-- study-tables:begin -->` and `<!-- study-tables:end -->`,
docs/performance.md's tables (scripts/perf_tables.py) and docs/serving.md's (scripts/serve_tables.py):

    python scripts/readme_tables.py            # rewrite every generated block
    python scripts/readme_tables.py --check    # exit 1 (and show the difference) when a block differs

Sources, each named in the table with the command that wrote it, the machine and the date:
- docs/benchmark/train_multi30k_fp32_avx2-epyc.json and train_multi30k_bf16_avx512bf16-epyc.json (`python
  scripts/benchmark.py --peer opennmt`): training speed, test BLEU, decoding time and peak memory, side by side
  with OpenNMT-py, nmt in fp32 and in bf16 (OpenNMT-py in fp32 in both);
- docs/study/caption_windows/study.json (de -> en) and docs/study/caption_windows_fr/study.json (fr -> en)
  (`nmt-study`): BLEU by window size k, the share of its k=1 BLEU each model keeps, the interaction (a model's
  share minus the fixed vector's, with its 95% intervals over the seeds and over the test set) and the paired
  tests; the tables themselves are nmt.study.tables'. A study whose file does not exist is left out, with no
  error; a page without the study markers gets no study table;
- the other files under docs/benchmark/, as scripts/perf_tables.py says;
- docs/serve_flood*.json and docs/serve_latency.json (`python scripts/serve_flood.py`, `scripts/serve_latency.py`),
  as scripts/serve_tables.py says.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path

from nmt.study.tables import (
    budget_markdown,
    decoding_text,
    pairs_findings_markdown,
    pairs_markdown,
    training_markdown,
)

sys.path.insert(0, str(Path(__file__).parent))
import perf_tables  # noqa: E402  (scripts/perf_tables.py: performance.md's tables, the first run, the suite)
import serve_tables  # noqa: E402  (scripts/serve_tables.py: serving.md's tables)

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
STUDY_DOC = ROOT / "docs" / "study.md"
PERF_DOC = ROOT / "docs" / "performance.md"
SERVING_DOC = ROOT / "docs" / "serving.md"
# the README's side-by-side runs: nmt in fp32 against OpenNMT-py in fp32, and nmt in bf16 against it
BENCHMARKS = (
    ROOT / "docs" / "benchmark" / "train_multi30k_fp32_avx2-epyc.json",
    ROOT / "docs" / "benchmark" / "train_multi30k_bf16_avx512bf16-epyc.json",
)
STUDY_DIR = ROOT / "docs" / "study"
# language pair -> (the study's JSON, how it was made: study.json cannot hold it, since a rebuild from its
# records must write the same file wherever the runs were)
STUDIES = {
    "de -> en": (
        STUDY_DIR / "caption_windows" / "study.json",
        "nmt-train experiment=bottleneck data.root=../shared/data/multi30k; "
        "nmt-study SWEEP --output docs/study/caption_windows",
    ),
    "fr -> en": (
        STUDY_DIR / "caption_windows_fr" / "study.json",
        "nmt-train experiment=bottleneck data.root=../shared/data/multi30k data.src_lang=fr; "
        "nmt-study SWEEP --output docs/study/caption_windows_fr",
    ),
}
# language pair -> (the study at 9 epochs, the study trained to validation BLEU's plateau): docs/study.md's budget
# section. While the converged records accumulate they live under docs/study/converged/; once complete they become
# the studies above and the 9-epoch ones move beside them as <study>_9epochs.
BUDGETS = {
    pair: (STUDY_DIR / f"{name}_9epochs" / "study.json", STUDY_DIR / name / "study.json")
    if (STUDY_DIR / f"{name}_9epochs").is_dir()
    else (STUDY_DIR / name / "study.json", STUDY_DIR / "converged" / name / "study.json")
    for pair, name in (("de -> en", "caption_windows"), ("fr -> en", "caption_windows_fr"))
}
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
BUDGET_BEGIN, BUDGET_END = "<!-- study-budget:begin -->", "<!-- study-budget:end -->"
STUDY_BEGIN, STUDY_END = "<!-- study-tables:begin -->", "<!-- study-tables:end -->"
SAME_RUN, SAME_STUDY = "the same run", "the same study"


def _rel(path: Path) -> str:
    """`path` relative to the repository when it is inside it (as the table names it)."""
    try:
        return path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return path.as_posix()


def command_text(command: str, written: Path | None = None) -> str:
    """The recorded command as the README spells commands, with no path of the machine that ran it: the
    interpreter as `python`, a folder under the shared folder beside the clone as `../shared/...`
    (`/work/shared/data/multi30k` -> `../shared/data/multi30k`), a script of a checkout elsewhere (a git worktree's
    `/w/wt/scripts/benchmark.py`) as this repository's `scripts/benchmark.py`, and --out as the committed file
    `written`."""
    words = command.split()
    if words and Path(words[0]).name.startswith("python"):
        words[0] = "python"
    for i, word in enumerate(words):
        if i and words[i - 1] == "--out" and written is not None:
            words[i] = _rel(written)
        elif word.startswith("/") and "/shared/" in word:
            words[i] = "../shared/" + word.split("/shared/", 1)[1]
        elif word.startswith("/") and Path(word).parent.name == "scripts" and word.endswith(".py"):
            words[i] = f"scripts/{Path(word).name}"
    return " ".join(words)


def machine_text(machine: dict) -> str:
    """e.g. 'AMD EPYC, AVX512, native bf16, glibc malloc, 2 threads, torch 2.13.0+cpu' from a JSON `machine`
    section (the malloc: peak memory depends on it; 'malloc not recorded' in files older than that record)."""
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
    malloc = str(machine.get("malloc") or "")
    parts.append(malloc if malloc.endswith("malloc") else f"{malloc} malloc" if malloc else "malloc not recorded")
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
    """(result, figure, source) rows of a side-by-side run of scripts/benchmark.py; the first row says in which
    precision each side trained and decoded."""
    ours = bench["figures"]
    train, decode = bench["train"], bench["decode"]
    peer_name, peer = next(iter(bench.get("peers", {}).items()), (None, None))
    theirs = peer["figures"] if peer and peer.get("ok") else None
    label, peer_precision = perf_tables.PEER.get(peer_name, (peer_name, "?"))
    label = label.split(" ")[0] if label else label
    source = source_cell(
        command_text(bench["command"], path), machine_text(bench["machine"]), f"{bench['date'][:10]} ({_rel(path)})"
    )
    corpus = corpus_text(decode.get("corpus", "multi30k-de-en"))
    sentences = decode["beam5"]["sentences"]
    precisions = f"nmt in {perf_tables.precision(bench)}" + (f" against {label} in {peer_precision}" if theirs else "")

    def vs(key: str, fmt: str, unit: str = "") -> str:
        if theirs is None:
            return f"{fmt.format(ours[key])}{unit}"
        return f"{fmt.format(ours[key])}{unit} against {label}'s {fmt.format(theirs[key])}{unit}: " + ratio(
            ours[key], theirs[key]
        )

    rows = [
        (
            f"training on {corpus}, {train['budget_seconds']:.0f} s (`experiment=multi30k_deen`), **{precisions}**",
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


def study_rows(study: dict, path: Path, command: str = STUDIES["de -> en"][1]) -> list[tuple[str, str, str]]:
    """(result, figure, source) rows of an nmt-study summary, its headline decoding: per model BLEU by k and the
    share kept, then each model's interaction with the fixed vector."""
    headline = study.get("headline", "greedy")
    results = (study.get("results") or {}).get(headline) or {}
    models = results.get("models") or {}
    runs = study.get("runs") or []
    cpus = sorted({str(r["cpu"]).split(" (recorded there")[0] for r in runs if r.get("cpu")})
    machine_cell = (", ".join(cpus) + ", 1 thread a run") if cpus else "machine not recorded"
    ended = sorted(str(r["trained_at"])[:10] for r in runs if r.get("trained_at"))
    date = (ended[0] if ended[0] == ended[-1] else f"{ended[0]}..{ended[-1]}") if ended else "date not recorded"
    source = source_cell(command_text(command), machine_cell, f"{date} ({_rel(path)})")
    trained_k = study.get("trained_k")
    study_name = f"bottleneck study, {corpus_text(str(study.get('corpus', '')))}, {decoding_text(headline)}"
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
        result = f"{study_name}, {m.get('label', key)}: test BLEU at k = {ks[0]}..{ks[-1]} captions"
        rows.append((result + (f" ({', '.join(extra)})" if extra else ""), figure, source if not rows else SAME_STUDY))
    for key, x in (results.get("interaction") or {}).items():
        if "difference" not in x:
            continue
        intervals = [
            f"{name} [{lo:+.3f}, {hi:+.3f}]"
            for name, pair in (("seeds", x.get("ci_seeds")), ("test set", x.get("ci_test")))
            if pair
            for lo, hi in [pair]
        ]
        rows.append(
            (
                f"{study_name}, interaction: share of k=1 BLEU kept at k={x.get('k', '?')}, {key} minus none "
                f"({x.get('seeds', '?')} seed pairs; 95% intervals over the seeds (t) and over the test set)",
                f"{x['difference']:+.3f}" + (f" ({'; '.join(intervals)})" if intervals else ""),
                source if not rows else SAME_STUDY,
            )
        )
    return rows


def existing_studies(studies: dict[str, tuple[Path, str]] | None = None) -> dict[str, tuple[dict, Path, str]]:
    """label -> (study.json's dict, its path, its command) for every study whose file exists."""
    out = {}
    for label, (path, command) in (STUDIES if studies is None else studies).items():
        if path.exists():
            out[label] = (json.loads(path.read_text(encoding="utf-8")), path, command)
    return out


def render(benchmarks: tuple[Path, ...] = BENCHMARKS, studies: dict[str, tuple[Path, str]] | None = None) -> str:
    """The results block (markers included), from the JSON files; a missing study file is left out."""
    rows = [
        row for study, path, command in existing_studies(studies).values() for row in study_rows(study, path, command)
    ]
    for benchmark in benchmarks:
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


def render_study(studies: dict[str, tuple[Path, str]] | None = None, every_decoding: bool = False) -> str:
    """The study block (markers included): BLEU by k of both language pairs side by side, then the interaction
    and the paired tests; the headline decoding (every_decoding: each decoding in turn). Without a study
    file, a line saying so."""
    found = {label: study for label, (study, _, _) in existing_studies(studies).items()}
    lines = [
        STUDY_BEGIN,
        "<!-- written by scripts/readme_tables.py from the studies' study.json; edit those, not these tables -->",
        "",
    ]
    if not found:
        return "\n".join([*lines, "No study has been committed yet.", "", STUDY_END])
    decodings = list(dict.fromkeys(d for s in found.values() for d in s["results"])) if every_decoding else [None]
    for decoding in decodings:
        lines += [pairs_markdown(found, decoding)]
    lines += [pairs_findings_markdown(found)]
    if every_decoding:
        lines += ["How each model's runs trained (from their records):", "", training_markdown(found)]
    lines += [STUDY_END]
    return "\n".join(lines)


def render_budget(budgets: dict[str, tuple[Path, Path]] | None = None) -> str:
    """docs/study.md's budget block (markers included): each pair's study at 9 epochs beside the same study
    trained to its plateau, both decodings; a pair whose converged study.json does not exist yet is named."""
    found, missing = {}, []
    for pair, (nine, converged) in (budgets or BUDGETS).items():
        if nine.is_file() and converged.is_file():
            found[pair] = tuple(json.loads(p.read_text(encoding="utf-8")) for p in (nine, converged))
        else:
            missing.append(pair)
    lines = [
        BUDGET_BEGIN,
        "<!-- written by scripts/readme_tables.py from both budgets' study.json; edit those, not these tables -->",
        "",
    ]
    for decoding in ("greedy", "beam5"):
        if any(decoding in s["results"] for pair in found.values() for s in pair):
            lines += [f"{decoding_text(decoding)}, 9 epochs -> to the plateau:", "", budget_markdown(found, decoding)]
    if missing:
        lines += [
            "No converged study yet for " + ", ".join(missing) + " (its records go to docs/study/converged/).",
            "",
        ]
    return "\n".join([*lines, BUDGET_END])


def replace_block(text: str, block: str, begin: str = BEGIN, end_marker: str = END, required: bool = True) -> str:
    """`text` with its block between `begin` and `end_marker` (markers included) replaced by `block`; a
    missing block is an error when `required`, else `text` is returned unchanged."""
    start, end = text.find(begin), text.find(end_marker)
    if start < 0 or end < start:
        if not required:
            return text
        raise SystemExit(f"readme_tables: error: the markers {begin} ... {end_marker} are missing from the page")
    return text[:start] + block + text[end + len(end_marker) :]


def marked(name: str) -> tuple[str, str]:
    """The markers of a generated block: `<!-- NAME:begin (written by ...) -->` ... `<!-- NAME:end -->`."""
    return f"<!-- {name}:begin (written by scripts/readme_tables.py from the JSON files it names) -->", (
        f"<!-- {name}:end -->"
    )


def generated(name: str, text: str) -> str:
    """A block of scripts/perf_tables.py or serve_tables.py between its markers (the begin marker says who writes
    it)."""
    begin, end = marked(name)
    return "\n".join([begin, text, end])


# the blocks of scripts/perf_tables.py and serve_tables.py: page -> [(marker name, what writes it)]
README_BLOCKS = (("first-run", perf_tables.first_run_block), ("suite-time", perf_tables.suite_block))
PERF_BLOCKS = (
    ("by-kind", perf_tables.by_kind_block),
    ("busy", perf_tables.busy_block),
    ("malloc", perf_tables.malloc_block),
    ("plan", perf_tables.plan_block),
)
SERVING_BLOCKS = (
    ("serve-flood", serve_tables.flood_block),
    ("serve-pages", serve_tables.pages_block),
    ("serve-latency", serve_tables.latency_block),
)


def rewritten(readme: str, doc: str, benchmarks: tuple[Path, ...], studies: dict | None) -> tuple[str, str]:
    """README's and docs/study.md's texts with every table written anew."""
    readme = replace_block(readme, render(benchmarks, studies))
    readme = replace_block(readme, render_study(studies), STUDY_BEGIN, STUDY_END, required=False)
    for name, write in README_BLOCKS:
        readme = replace_block(readme, generated(name, write()), *marked(name))
    doc = replace_block(doc, render_study(studies, every_decoding=True), STUDY_BEGIN, STUDY_END, required=False)
    doc = replace_block(doc, render_budget(), BUDGET_BEGIN, BUDGET_END, required=False)
    return readme, doc


def rewritten_blocks(page: str, blocks: tuple = PERF_BLOCKS) -> str:
    """A page (docs/performance.md by default) with each of `blocks` written anew between its markers."""
    for name, write in blocks:
        page = replace_block(page, generated(name, write()), *marked(name))
    return page


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[1], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when a table differs; write nothing")
    parser.add_argument("--readme", type=Path, default=README)
    parser.add_argument("--study-doc", type=Path, default=STUDY_DOC)
    parser.add_argument("--perf-doc", type=Path, default=PERF_DOC)
    parser.add_argument("--serving-doc", type=Path, default=SERVING_DOC)
    args = parser.parse_args(argv)
    pages = (args.readme, args.study_doc, args.perf_doc, args.serving_doc)
    old = [page.read_text(encoding="utf-8") for page in pages]
    new = [
        *rewritten(old[0], old[1], BENCHMARKS, None),
        rewritten_blocks(old[2]),
        rewritten_blocks(old[3], SERVING_BLOCKS),
    ]
    changed = [(path, a, b) for path, a, b in zip(pages, old, new, strict=True) if a != b]
    if args.check:
        for path, a, b in changed:
            sys.stdout.writelines(
                difflib.unified_diff(a.splitlines(True), b.splitlines(True), str(path), "scripts/readme_tables.py")
            )
            print(f"{path}: a table differs from the JSON files; run python scripts/readme_tables.py")
        return 1 if changed else 0
    for path, _, b in changed:
        path.write_text(b, encoding="utf-8")
        print(f"{path}: tables written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
