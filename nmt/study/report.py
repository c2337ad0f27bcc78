"""The bottleneck study's report: study.md (tables), study.json (every number) and the figures.

    write_study(summary, Path("docs/study/caption_windows"))     # after nmt.study.build.summarise
    print(windows_markdown(summary), paired_markdown(summary), interaction_markdown(summary))

`summary` is study.json's dict; the figures are drawn from it alone: bleu_by_window.png (BLEU by k, seed
mean with its 95% interval and each seed's point), bleu_by_length.png, learning_curves.png and
attention_long.png (one long input, a panel per model).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from nmt.metrics import format_number as num
from nmt.study.stats import format_p

FIGURES = ("bleu_by_window", "bleu_by_length", "learning_curves", "attention_long")


def _cell(row: dict, digits: int = 1) -> str:
    if row.get("bleu") is None:
        return "-"
    return f"{row['bleu']:.{digits}f} [{row['low']:.{digits}f}, {row['high']:.{digits}f}]"


def _k_head(s: dict) -> str:
    return f"k={s['k']}" + ("" if s["trained"] else " (untrained)") + f" n={s['n']}, {s['source_words']:.0f} words"


def windows_markdown(summary: dict) -> str:
    """A row per model, a column per k: seed-mean BLEU [95% interval]; then the ratio BLEU(k=K) / BLEU(k=1)."""
    sets = summary["sets"]
    k_top = next((m["ratio_k"] for m in summary["models"].values() if "ratio_k" in m), None)
    heads = [_k_head(s) for s in sets] + ([f"k={k_top} / k=1"] if k_top else [])
    lines = ["| model | seeds | " + " | ".join(heads) + " |", "|---|---:|" + "---:|" * len(heads)]
    for key, m in summary["models"].items():
        cells = [_cell(r) for r in m["by_k"]] + ([num(m.get("ratio"))] if k_top else [])
        lines.append(f"| {key}: {m['label']} | {m['seeds']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def paired_markdown(summary: dict) -> str:
    """A row per tested model, a column per k: BLEU difference against none, Holm-adjusted p, the seeds'
    verdict."""
    if not summary["paired"]:
        return ""
    B = summary["bootstrap"]
    heads = [_k_head(s) for s in summary["sets"]]
    lines = ["| model vs none | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(heads)]
    for key, cells in summary["paired"].items():
        row = []
        for s in summary["sets"]:
            c = cells[str(s["k"])]
            verdict = "significant" if c["significant"] else ("seeds disagree" if not c["seeds_agree"] else "n.s.")
            deltas = "/".join(f"{d:+.1f}" for d in c["deltas"])
            row.append(
                f"{c['delta']:+.1f} ({deltas}); p {format_p(c['p'], B)}, Holm {format_p(c['p_holm'], B)}; {verdict}"
            )
        lines.append(f"| {key} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def interaction_markdown(summary: dict) -> str:
    """A row per tested model: its ratio, none's, the difference with its 95% interval, what was resampled."""
    if not summary["interaction"]:
        return ""
    base = summary["models"].get("none", {})
    lines = [
        "| model | ratio | none's ratio | difference | 95% interval | seeds | resampled |",
        "|---|---:|---:|---:|---|---:|---|",
    ]
    for key, x in summary["interaction"].items():
        lo, hi = x["ci95"]
        lines.append(
            f"| {key} | {num(summary['models'][key].get('ratio'), 3)} | {num(base.get('ratio'), 3)} | "
            f"{x['difference']:+.3f} | [{lo:+.3f}, {hi:+.3f}] | {x['seeds']} | {x['resampled']} |"
        )
    return "\n".join(lines) + "\n"


def length_markdown(summary: dict) -> str:
    bl = summary["by_length"]
    heads = [f"{lab} words (n={n})" for lab, n in zip(bl["labels"], bl["counts"], strict=True)]
    lines = ["| model | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(heads)]
    for key, rows in bl["rows"].items():
        lines.append(f"| {key} | " + " | ".join(_cell(r) for r in rows) + " |")
    B = summary["bootstrap"]
    for key, cells in bl["tests"].items():
        tests = {c["bucket"]: c for c in cells}
        row = [
            "-"
            if lab not in tests
            else f"{tests[lab]['delta']:+.1f}, Holm p {format_p(tests[lab]['p_holm'], B)}"
            + ("" if tests[lab]["significant"] else " (n.s.)")
            for lab in bl["labels"]
        ]
        lines.append(f"| {key} vs none | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def runs_markdown(summary: dict) -> str:
    lines = [
        "| run | seed | BLEU by k | training | ended (UTC) | steps | best step | CPU | torch | commit | decoding |",
        "|---|---:|---|---:|---|---:|---:|---|---|---|---|",
    ]
    for r in summary["runs"]:
        by_k = " / ".join(f"{v:.1f}" for v in r["bleu_by_k"].values())
        commit = (r["commit"] or "-")[:12]
        lines.append(
            f"| {r['name']} | {r['seed']} | {by_k} | {r['train_minutes']:.1f} min | {r.get('trained_at') or '-'} | "
            f"{r['steps']} | "
            f"{r['best'].get('step')} | {r['cpu']} | {r['torch']} | {commit} | {r['precision']} |"
        )
    return "\n".join(lines) + "\n"


def study_markdown(summary: dict) -> str:
    d, rs, ov = summary["decoding"], summary["resampling"], summary["overlap"]
    decoding = "greedy" if d.get("beam_size", 1) == 1 else f"beam {d['beam_size']}"
    lines = [
        f"# Attention and input length: {summary['corpus']}, {summary['split']}",
        "",
        f"Each column holds the same {summary['sets'][0]['n']} test items of `{summary['split']}` joined k at a time "
        "(sources and references joined with a space), so every k has the same reference words and only the "
        f"length of one input grows. Training joined 1..{summary['trained_k']} items. "
        f"{decoding.capitalize()} decoding; "
        f"sacrebleu BLEU ({summary['signatures'].get('bleu') if summary.get('signatures') else ''}).",
        "",
        f"Cells: the seeds' mean BLEU with a 95% interval over {rs['samples']} resamples of the test {rs['unit']}s "
        "(one draw for every k, so a resample holds the same content at every k) and of the seeds.",
        "",
        "![BLEU by window size](bleu_by_window.png)",
        "",
        windows_markdown(summary),
        "## The interaction: how much of its k=1 BLEU each model keeps",
        "",
        "Per seed, a model's ratio BLEU(k=K) / BLEU(k=1) minus none's ratio with the same seed, averaged over "
        "seeds; the interval resamples the test units and the seeds (paired across models).",
        "",
        interaction_markdown(summary),
        "## Paired tests against none",
        "",
        f"Method: {rs['test']}. Resampling seed {rs['seed']}, {rs['samples']} resamples (smallest p "
        f"1/{rs['samples'] + 1}). Cells: mean BLEU difference (per seed); raw p; Holm-adjusted p; verdict.",
        "",
        paired_markdown(summary),
        "## BLEU by source length (every k pooled)",
        "",
        "Items of every k pooled and bucketed by source words; intervals resample the items of a bucket and the "
        "seeds (the pooled items share content across k, so these intervals are indicative only).",
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
    summary["files"] = {name: f"{name}.png" for name in FIGURES} | {"md": "study.md", "json": "study.json"}
    unit = "items" if summary["resampling"]["unit"].startswith("chapter") else "captions"
    fig = plotting.bleu_by_window_figure(
        {key: m["by_k"] for key, m in summary["models"].items()},
        f"BLEU by k ({summary['split']}; seed mean, 95% interval, each seed a dot)",
        xlabel=f"{unit} per input (window size k)",
        trained_k=summary["trained_k"],
    )
    plotting.save_figure(fig, out_dir / "bleu_by_window.png")
    bl = summary["by_length"]
    series = {key: [{**r, "n": r["n"]} for r in rows] for key, rows in bl["rows"].items()}
    fig = plotting.bleu_by_length_figure(series, "BLEU by source length (every k pooled; seed mean, 95% interval)")
    plotting.save_figure(fig, out_dir / "bleu_by_length.png")
    curves = {
        key: [r["learning_curve"] for r in summary["runs"] if r["name"] in m["runs"]]
        for key, m in summary["models"].items()
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
