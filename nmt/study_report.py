"""The bottleneck study's report: the markdown table, study.md, study.json and the three figures.

    write_study(summary, groups, Path("multirun/2024-05-01/12-00-00"))   # after nmt.study.run_study
    print(table_markdown(summary))

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
    from nmt.study import Run


def table_markdown(summary: dict) -> str:
    """A row per attention (group), a column per bucket: BLEU [95% interval], then overall numbers."""
    groups, labels = summary["groups"], summary["buckets"]["labels"]
    counts = [{g["by_length"][k]["n"] for g in groups} for k in range(len(labels))]
    same_n = all(len(c) == 1 for c in counts)
    heads = [f"{lab} words" + (f" (n={min(c)})" if same_n else "")
             for lab, c in zip(labels, counts, strict=True)]
    heads += ["BLEU", "chrF", "parameters", "steps", "epochs", "training"]
    lines = ["| attention | seeds | " + " | ".join(heads) + " |", "|---|---:|" + "---:|" * len(heads)]
    for g in groups:
        cells = []
        for r in g["by_length"]:
            interval = f" [{r['low']:.1f}, {r['high']:.1f}]" if r["low"] is not None else ""
            cells.append("-" if r["bleu"] is None else f"{r['bleu']:.1f}{interval}"
                         + ("" if same_n else f" (n={r['n']})"))
        lines.append(f"| {g['label']} | {len(g['seeds'])} | " + " | ".join(cells) + f" | {num(g['bleu'])} | "
                     f"{num(g['chrf'])} | {g['parameters']:,} | {g['steps']} | {num(g['epochs'], 1)} | "
                     f"{num(g['train_minutes'], 1)} min |")
    return "\n".join(lines) + "\n"


def study_markdown(summary: dict) -> str:
    d, ls = summary["decoding"], summary["long_sentence"]
    decoding = "greedy" if d.get("beam_size", 1) == 1 else f"beam {d['beam_size']}"
    interval = (f"95% bootstrap interval ({summary['bootstrap']} resamples of the bucket's sentences; for "
                "several seeds, the BLEU is their mean and the interval spans all their intervals)"
                if summary["bootstrap"] else "no intervals (--bootstrap 0)")
    lines = [f"# Attention and sentence length: {summary['corpus']}, {summary['split']} split", "",
             f"{summary['sentences']} sentences, {decoding} decoding. Cells: corpus BLEU of the sentences "
             f"whose source has that many words, with a {interval}. BLEU, chrF: the whole split. Steps, "
             "epochs, training time: the whole training (the best checkpoint may be earlier).", "",
             table_markdown(summary), *[f"- {n}" for n in summary["notes"]], "",
             "![BLEU by source length](bleu_by_length.png)", "",
             "![validation BLEU over training time](learning_curves.png)", "",
             f"## One long sentence (#{ls['sentence']}, {ls['words']} words)", "",
             "![attention on a long sentence](attention_long_sentence.png)", "",
             f"- source: {ls['source']}", f"- reference: {ls['reference']}",
             *[f"- {label}: {text}" for label, text in ls["outputs"].items()], "",
             "## Runs", "", "| run | attention | seed | BLEU | chrF | best step | steps | finished |",
             "|---|---|---:|---:|---:|---:|---:|---|"]
    lines += [f"| `{r['path']}` | {r['attention']} | {r['seed']} | {num(r['bleu'])} | {num(r['chrf'])} "
              f"| {r['best_step']} | {r['step']} | {'yes' if r['finished'] else 'no'} |"
              for r in summary["runs"]]
    return "\n".join(lines) + "\n"


def write_study(summary: dict, groups: Sequence[tuple[str, list[Run]]], out_dir: Path) -> None:
    """study.md, study.json and the three figures into `out_dir` (paths recorded in summary["files"])."""
    from nmt import plotting

    out_dir.mkdir(parents=True, exist_ok=True)
    files = summary["files"]
    series = {g["label"]: [{k: v for k, v in r.items() if v is not None} for r in g["by_length"]]
              for g in summary["groups"]}
    fig = plotting.bleu_by_length_figure(series, f"BLEU by source length ({summary['split']}, 95% intervals)")
    files["bleu_by_length"] = str(plotting.save_figure(fig, out_dir / "bleu_by_length.png"))
    curves = {g["label"]: [r["learning_curve"] for r in summary["runs"] if r["path"] in g["runs"]]
              for g in summary["groups"]}
    fig = plotting.learning_curves_figure(curves)
    files["learning_curves"] = str(plotting.save_figure(fig, out_dir / "learning_curves.png"))
    ls = summary["long_sentence"]
    panels = [(label, t.attention, t.src_pieces, t.tgt_pieces, members[0].has_alignment)
              for label, members in groups for t in [members[0].long]]
    source = ls["source"] if len(ls["source"]) <= 90 else ls["source"][:90] + "..."
    title = f"{summary['corpus']} {summary['split']} #{ls['sentence']} ({ls['words']} words): {source}"
    fig = plotting.attention_panels_figure(panels, title)
    files["attention_long_sentence"] = str(plotting.save_figure(fig, out_dir / "attention_long_sentence.png"))
    files["md"], files["json"] = str(out_dir / "study.md"), str(out_dir / "study.json")
    Path(files["md"]).write_text(study_markdown(summary), encoding="utf-8")
    Path(files["json"]).write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
