"""The bottleneck study's report: study.md (tables), study.json (every number) and the figures.

    write_study(summary, Path("docs/study/caption_windows"))     # after nmt.study.summary.summarise

`summary` is study.json's dict; the tables are nmt.study.tables', the figures are drawn from it alone:
bleu_by_window.png (BLEU by k of the headline decoding, seed mean with its 95% interval over the seeds and
each seed's point), bleu_by_window_<decoding>.png for each other decoding (e.g. beam5), bleu_by_length.png,
learning_curves.png and attention_long.png (one long input, a panel per model).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from nmt.study.tables import (
    decoding_text,
    interaction_markdown,
    length_markdown,
    paired_markdown,
    runs_markdown,
    windows_markdown,
)

FIGURES = ("bleu_by_window", "bleu_by_length", "learning_curves", "attention_long")


def decoding_markdown(summary: dict, decoding: str) -> list[str]:
    """One decoding's sections: BLEU by k (over seeds, over the test set), the interaction, the paired tests."""
    rs, B = summary["resampling"], summary["bootstrap"]
    figure = "bleu_by_window.png" if decoding == summary["headline"] else f"bleu_by_window_{decoding}.png"
    text = decoding_text(decoding)
    return [
        f"## {text.capitalize()} decoding" + (" (the headline)" if decoding == summary["headline"] else ""),
        "",
        f"![BLEU by window size, {text}]({figure})",
        "",
        "Cells: the seeds' mean BLEU with a 95% t-interval over the seeds (S - 1 degrees of freedom; a model "
        "with one seed: over the test set instead).",
        "",
        windows_markdown(summary, decoding),
        f"The same means with a 95% interval over the test set: {B} draws of each k's {rs['unit']}s, the seeds "
        "fixed (how far another test set of the kind could move them).",
        "",
        windows_markdown(summary, decoding, test=True),
        f"### The interaction ({text}): how much of its k=1 BLEU each model keeps",
        "",
        "Per seed, a model's ratio BLEU(k=K) / BLEU(k=1) (on the captions the windows of K hold) minus none's "
        f"ratio with the same seed, averaged over the seeds; intervals over the seeds (t) and over {B} draws "
        f"of the test set's {rs['interaction']}.",
        "",
        interaction_markdown(summary, decoding),
        f"### Paired tests against none ({text})",
        "",
        f"Method: {rs['test']}. Resampling seed {rs['seed']}, {B} resamples (smallest p 1/{B + 1}; every p "
        "rounded up). Cells: mean BLEU difference (per seed); raw p; Holm-adjusted p; verdict.",
        "",
        paired_markdown(summary, decoding),
    ]


def study_markdown(summary: dict) -> str:
    rs, ov, headline = summary["resampling"], summary["overlap"], summary["headline"]
    others = [decoding_text(d) for d in summary["results"] if d != headline]
    lines = [
        f"# Attention and input length: {summary['corpus']}, {summary['split']}",
        "",
        f"Each column holds the same {summary['sets'][0]['n']} test items of `{summary['split']}` joined k at a time "
        "(sources and references joined with a space) in windows of exactly k, a unit's last n mod k items left "
        "out, so every k has the same reference words and only the length of one input grows. Training joined "
        f"1..{summary['trained_k']} items. Headline: {decoding_text(headline)} decoding"
        + (f"; {', '.join(others)} beside it" if others else "")
        + f"; sacrebleu BLEU ({summary['signatures'].get('bleu') if summary.get('signatures') else ''}).",
        "",
        f"Seeds: {rs['seeds']}. Test set: at each k the unit drawn is the {rs['unit']}, each with all of its "
        "sufficient statistics (sacrebleu's paired bootstrap on that k's windows).",
        "",
    ]
    for decoding in summary["results"]:
        lines += decoding_markdown(summary, decoding)
    lines += [
        f"## BLEU by source length (every k pooled, {decoding_text(headline)})",
        "",
        "Items of every k pooled and bucketed by source words; intervals over the seeds, tests on draws of a "
        "bucket's items (the pooled items share content across k, so these are indicative only).",
        "",
        length_markdown(summary),
        "![BLEU by source length](bleu_by_length.png)",
        "",
        "![validation BLEU over training](learning_curves.png)",
        "",
        "![attention on one long input](attention_long.png)",
        "",
        "## Test set and runs",
        "",
        f"Overlap with the training text: of {ov['pairs']} test pairs, {ov['source']} share their source, "
        f"{ov['target']} their target and {ov['both']} both with a training pair.",
        "",
        runs_markdown(summary),
        *[f"- {n}" for n in summary["notes"]],
    ]
    return "\n".join(lines) + "\n"


def write_study(summary: dict, out_dir: Path) -> None:
    """study.md, study.json and the figures into `out_dir` (their names in summary["files"])."""
    from nmt import plotting

    out_dir.mkdir(parents=True, exist_ok=True)
    headline = summary["headline"]
    windows = {d: "bleu_by_window" if d == headline else f"bleu_by_window_{d}" for d in summary["results"]}
    figures = [windows[headline], *FIGURES[1:], *(f for d, f in windows.items() if d != headline)]
    summary["files"] = {name: f"{name}.png" for name in figures} | {"md": "study.md", "json": "study.json"}
    unit = "items" if summary["resampling"]["unit"].startswith("chapter") else "captions"
    for decoding, name in windows.items():
        fig = plotting.bleu_by_window_figure(
            {key: m["by_k"] for key, m in summary["results"][decoding]["models"].items()},
            f"BLEU by k ({summary['split']}, {decoding_text(decoding)}; seed mean, 95% t-interval over the seeds, "
            "each seed a dot)",
            xlabel=f"{unit} per input (window size k)",
            trained_k=summary["trained_k"],
        )
        plotting.save_figure(fig, out_dir / f"{name}.png")
    res = summary["results"][headline]
    series = {key: [{**r, "n": r["n"]} for r in rows] for key, rows in res["by_length"]["rows"].items()}
    fig = plotting.bleu_by_length_figure(
        series, f"BLEU by source length (every k pooled, {decoding_text(headline)}; seed mean, 95% interval)"
    )
    plotting.save_figure(fig, out_dir / "bleu_by_length.png")
    curves = {
        key: [r["learning_curve"] for r in summary["runs"] if r["name"] in m["runs"]]
        for key, m in res["models"].items()
    }
    plotting.save_figure(plotting.learning_curves_figure(curves), out_dir / "learning_curves.png")
    panels = [
        (key, np.asarray(x["attention"] or [[0.0]]), x["src_pieces"], x["tgt_pieces"], x["attention"] is not None)
        for key, x in summary["long"].items()
    ]
    one = next(iter(summary["long"].values()))
    source = one["source"] if len(one["source"]) <= 90 else one["source"][:90] + "..."
    fig = plotting.attention_panels_figure(panels, f"{summary['corpus']} {one['set']} #{one['index'] + 1}: {source}")
    plotting.save_figure(fig, out_dir / "attention_long.png")
    (out_dir / "study.md").write_text(study_markdown(summary), encoding="utf-8")
    (out_dir / "study.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
