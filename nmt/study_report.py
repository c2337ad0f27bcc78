"""The bottleneck study's report: the markdown tables, study.md, study.json and the figures.

    write_study(summary, groups, Path("multirun/2024-05-01/12-00-00"))   # after nmt.study.run_study
    print(table_markdown(summary), windows_markdown(summary), tests_markdown(summary))

`summary` is the dict nmt.study.run_study builds (groups, runs, buckets, long_sentence, ...); `groups` pairs
each label with its runs, whose long-sentence translations give the attention panels.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from nmt.metrics import format_number as num

if TYPE_CHECKING:
    from nmt.study_runs import Run


def _cell(row: dict, digits: int = 1) -> str:
    """A cell as text, BLEU [low, high]: the seeds' mean and its interval ("-" without sentences)."""
    if row.get("bleu") is None:
        return "-"
    interval = f" [{row['low']:.{digits}f}, {row['high']:.{digits}f}]" if row.get("low") is not None else ""
    return f"{row['bleu']:.{digits}f}{interval}"


def _test(test: dict | None) -> str:
    """A test as text, +13.2 (p=0.001): the BLEU difference against none (mean over seed pairs) and the
    largest p-value over the seed pairs ("-" without a test)."""
    return "-" if test is None else f"{test['delta']:+.1f} (p={test['p_max']:.3f})"


def table_markdown(summary: dict) -> str:
    """A row per group (its decoder), a column per bucket: BLEU [95% interval], then overall numbers."""
    groups, labels = summary["groups"], summary["buckets"]["labels"]
    counts = [{g["by_length"][k]["n"] for g in groups} for k in range(len(labels))]
    same_n = all(len(c) == 1 for c in counts)
    heads = [f"{lab} words" + (f" (n={min(c)})" if same_n else "") for lab, c in zip(labels, counts, strict=True)]
    heads += ["BLEU", "chrF", "parameters", "steps", "epochs", "training"]
    lines = ["| decoder | seeds | " + " | ".join(heads) + " |", "|---|---:|" + "---:|" * len(heads)]
    for g in groups:
        cells = [_cell(r) + ("" if same_n or r["bleu"] is None else f" (n={r['n']})") for r in g["by_length"]]
        lines.append(
            f"| {g['label']} | {len(g['seeds'])} | " + " | ".join(cells) + f" | {_cell(g, 2)} | "
            f"{num(g['chrf'])} | {g['parameters']:,} | {g['steps']} | {num(g['epochs'], 1)} | "
            f"{num(g['train_minutes'], 1)} min |"
        )
    return "\n".join(lines) + "\n"


def windows_markdown(summary: dict) -> str:
    """A row per group, a column per window size k: BLEU [95% interval]; then BLEU(k=K) / BLEU(k=1).
    Empty without verse windows."""
    w = summary.get("windows")
    if not w:
        return ""
    big = len(w["splits"])
    heads = [
        f"k={k} (n={n}, {words:.0f} words)"
        for k, (n, words) in enumerate(zip(w["n"], w["source_words"], strict=True), start=1)
    ]
    lines = [
        "| decoder | seeds | " + " | ".join(heads) + f" | BLEU k={big} / k=1 |",
        "|---|---:|" + "---:|" * (len(heads) + 1),
    ]
    for g in summary["groups"]:
        ratio = "-" if g.get("window_ratio") is None else f"{g['window_ratio']:.2f}"
        lines.append(
            f"| {g['label']} | {len(g['seeds'])} | " + " | ".join(_cell(r) for r in g["by_window"]) + f" | {ratio} |"
        )
    return "\n".join(lines) + "\n"


def tests_markdown(summary: dict) -> str:
    """A row per tested group: BLEU difference against none and the largest p over seed pairs, for the
    whole split, each bucket and each window size. Empty without tests."""
    tests = summary.get("tests")
    if not tests or not tests["pairs"]:
        return ""
    windows = (summary.get("windows") or {}).get("splits", [])
    heads = [
        "seed pairs",
        f"all of {summary['split']}",
        *[f"{b} words" for b in summary["buckets"]["labels"]],
        *[f"k={k}" for k in range(1, len(windows) + 1)],
    ]
    lines = ["| decoder | " + " | ".join(heads) + " |", "|---|---|" + "---:|" * (len(heads) - 1)]
    for g in summary["groups"]:
        pairs = tests["pairs"].get(g["label"])
        if pairs is None:
            continue
        seeds = ", ".join(f"{a}/{b}" for a, b in pairs["seeds"])
        cells = [
            _test(g["test"]),
            *[_test(r["test"]) for r in g["by_length"]],
            *[_test(r["test"]) for r in g.get("by_window", [])],
        ]
        lines.append(f"| {g['label']} | {seeds} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def study_markdown(summary: dict) -> str:
    d, ls = summary["decoding"], summary["long_sentence"]
    decoding = "greedy" if d.get("beam_size", 1) == 1 else f"beam {d['beam_size']}"
    interval = (
        f"95% interval over seeds x sentences ({summary['bootstrap']} bootstrap replicates; each "
        "resamples the cell's sentences, the same ones for every run, and the group's seeds, both "
        "with replacement, and takes the mean BLEU of the drawn seeds; with one seed, the plain "
        "bootstrap over sentences)"
        if summary["bootstrap"]
        else "no intervals (--bootstrap 0)"
    )
    lines = [
        f"# Attention and sentence length: {summary['corpus']}, {summary['split']} split",
        "",
        f"{summary['sentences']} sentences, {decoding} decoding. A row per group of runs that differ only "
        "in the seed, named by the decoder it is (attention; RNNsearch order = the context enters the "
        "LSTM step, Luong order = it joins after the step; input feeding). Cells: the seeds' mean corpus "
        f"BLEU of the sentences whose source has that many words, with a {interval}. BLEU, chrF: the "
        "whole split. Steps, epochs, training time: the whole training (the best checkpoint may be "
        "earlier).",
        "",
        table_markdown(summary),
        *[f"- {n}" for n in summary["notes"]],
        "",
        "![BLEU by source length](bleu_by_length.png)",
        "",
    ]
    if summary.get("windows"):
        big = len(summary["windows"]["splits"])
        lines += [
            "## The same verses, k at a time",
            "",
            f"test_k1..test_k{big}: the test chapters cut into windows of k consecutive verses, sources "
            "and references joined with a space (a chapter's last window may hold fewer), so every k "
            "has the same verses and the same reference words; only the length of one input grows. "
            "Columns: k, the number of windows and their mean source words. Cells as above.",
            "",
            windows_markdown(summary),
            "![BLEU by window size](bleu_by_window.png)",
            "",
        ]
    tests = summary.get("tests")
    if tests and tests["pairs"]:
        lines += [
            "## Paired tests against none",
            "",
            f"What was tested: {tests['method']}. A cell gives the BLEU difference (row minus none, "
            "the mean over the seed pairs) and the largest p-value over the seed pairs (every pair's "
            "p-value is in study.json); p < 0.05 in a cell means the difference is significant in "
            "every seed pair. Seed pairs: row seed / none seed.",
            "",
            tests_markdown(summary),
        ]
    lines += [
        "![validation BLEU over training time](learning_curves.png)",
        "",
        f"## One long sentence (#{ls['sentence']}, {ls['words']} words)",
        "",
        "![attention on a long sentence](attention_long_sentence.png)",
        "",
        f"- source: {ls['source']}",
        f"- reference: {ls['reference']}",
        *[f"- {label}: {text}" for label, text in ls["outputs"].items()],
        "",
        "## Runs",
        "",
        "| run | attention | seed | BLEU | chrF | best step | steps | finished |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    lines += [
        f"| `{r['path']}` | {r['attention']} | {r['seed']} | {num(r['bleu'])} | {num(r['chrf'])} "
        f"| {r['best_step']} | {r['step']} | {'yes' if r['finished'] else 'no'} |"
        for r in summary["runs"]
    ]
    return "\n".join(lines) + "\n"


def write_study(summary: dict, groups: Sequence[tuple[str, list[Run]]], out_dir: Path) -> None:
    """study.md, study.json and the figures into `out_dir` (paths recorded in summary["files"]):
    bleu_by_length.png, bleu_by_window.png (with verse windows), learning_curves.png and
    attention_long_sentence.png."""
    from nmt import plotting

    out_dir.mkdir(parents=True, exist_ok=True)
    files = summary["files"]
    series = {
        g["label"]: [{k: v for k, v in r.items() if v is not None} for r in g["by_length"]] for g in summary["groups"]
    }
    fig = plotting.bleu_by_length_figure(
        series, f"BLEU by source length ({summary['split']}; seed mean, 95% interval over seeds x sentences)"
    )
    files["bleu_by_length"] = str(plotting.save_figure(fig, out_dir / "bleu_by_length.png"))
    if summary.get("windows"):
        series = {g["label"]: g["by_window"] for g in summary["groups"]}
        fig = plotting.bleu_by_window_figure(
            series, "BLEU by window size (the same test verses, k at a time; seed mean, 95% interval)"
        )
        files["bleu_by_window"] = str(plotting.save_figure(fig, out_dir / "bleu_by_window.png"))
    curves = {
        g["label"]: [r["learning_curve"] for r in summary["runs"] if r["path"] in g["runs"]] for g in summary["groups"]
    }
    fig = plotting.learning_curves_figure(curves)
    files["learning_curves"] = str(plotting.save_figure(fig, out_dir / "learning_curves.png"))
    ls = summary["long_sentence"]
    panels = [
        (label, t.attention, t.src_pieces, t.tgt_pieces, members[0].has_alignment)
        for label, members in groups
        for t in [members[0].long]
    ]
    source = ls["source"] if len(ls["source"]) <= 90 else ls["source"][:90] + "..."
    title = f"{summary['corpus']} {summary['split']} #{ls['sentence']} ({ls['words']} words): {source}"
    fig = plotting.attention_panels_figure(panels, title)
    files["attention_long_sentence"] = str(plotting.save_figure(fig, out_dir / "attention_long_sentence.png"))
    files["md"], files["json"] = str(out_dir / "study.md"), str(out_dir / "study.json")
    Path(files["md"]).write_text(study_markdown(summary), encoding="utf-8")
    Path(files["json"]).write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
