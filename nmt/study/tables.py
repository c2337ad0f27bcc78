"""A study's tables in Markdown, from study.json's dict alone (no numbers typed by hand anywhere).

    windows_markdown(summary)                 # BLEU by k, a row per model (headline decoding; or decoding="beam5")
    paired_markdown(summary), interaction_markdown(summary), length_markdown(summary), runs_markdown(summary)
    pairs_markdown({"de -> en": de, "fr -> en": fr})         # several studies side by side (README, docs/study.md)
    pairs_findings_markdown({"de -> en": de, "fr -> en": fr})

Every row names its number of seeds; a p-value is printed by nmt.study.stats.format_p (rounded up).
"""

from __future__ import annotations

from nmt.metrics import format_number as num
from nmt.study.stats import format_p

# the README's names of the papers' models (by the decoder label nmt.study.configs.decoder_label gives)
PAPER_NAMES = {
    "none (RNNencdec: context into every step)": "RNNencdec (`none`)",
    "bahdanau (RNNsearch order)": "RNNsearch (`bahdanau`)",
    "luong general (Luong order)": "Luong `general`",
}


def decoding_text(name: str) -> str:
    """`greedy` -> "greedy", `beam5` -> "beam 5"."""
    return name if name == "greedy" else f"beam {name.removeprefix('beam')}"


def _results(summary: dict, decoding: str | None) -> dict:
    return summary["results"][decoding or summary["headline"]]


def _cell(row: dict, digits: int = 1, low: str = "low", high: str = "high") -> str:
    if row.get("bleu") is None:
        return "-"
    if row.get(low) is None:
        return f"{row['bleu']:.{digits}f}"
    return f"{row['bleu']:.{digits}f} [{row[low]:.{digits}f}, {row[high]:.{digits}f}]"


def _test_cell(row: dict) -> str:
    if row.get("bleu") is None or not row.get("ci_test"):
        return "-"
    return f"{row['bleu']:.1f} [{row['ci_test'][0]:.1f}, {row['ci_test'][1]:.1f}]"


def _k_head(s: dict) -> str:
    left = f" ({s['left_out']} left out)" if s.get("left_out") else ""
    return (
        f"k={s['k']}" + ("" if s["trained"] else " (untrained)") + f" n={s['n']}{left}, {s['source_words']:.0f} words"
    )


def _interval(x: list | None, digits: int = 3, sign: bool = True) -> str:
    if not x:
        return "-"
    f = f"{{:{'+' if sign else ''}.{digits}f}}"
    return f"[{f.format(x[0])}, {f.format(x[1])}]"


def windows_markdown(summary: dict, decoding: str | None = None, test: bool = False) -> str:
    """A row per model, a column per k: seed-mean BLEU [95% t-interval over the seeds] (test=True: [95%
    interval over draws of the windows]); then the ratio BLEU(k=K) / BLEU(k=1)."""
    models = _results(summary, decoding)["models"]
    k_top = next((m["ratio_k"] for m in models.values() if "ratio_k" in m), None)
    heads = [_k_head(s) for s in summary["sets"]] + ([f"k={k_top} / k=1"] if k_top else [])
    lines = ["| model | seeds | " + " | ".join(heads) + " |", "|---|---:|" + "---:|" * len(heads)]
    for key, m in models.items():
        cells = [_test_cell(r) if test else _cell(r) for r in m["by_k"]] + ([num(m.get("ratio"))] if k_top else [])
        lines.append(f"| {key}: {m['label']} | {m['seeds']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _verdict(c: dict) -> str:
    return "significant" if c["significant"] else ("seeds disagree" if not c["seeds_agree"] else "n.s.")


def paired_markdown(summary: dict, decoding: str | None = None) -> str:
    """A row per tested model, a column per k: BLEU difference against none (per seed), raw p, Holm p,
    the verdict."""
    paired = _results(summary, decoding)["paired"]
    if not paired:
        return ""
    B = summary["bootstrap"]
    heads = [_k_head(s) for s in summary["sets"]]
    lines = ["| model vs none | seed pairs | " + " | ".join(heads) + " |", "|---|---:|" + "---:|" * len(heads)]
    for key, cells in paired.items():
        row = []
        for s in summary["sets"]:
            c = cells[str(s["k"])]
            deltas = "/".join(f"{d:+.1f}" for d in c["deltas"])
            row.append(
                f"{c['delta']:+.1f} ({deltas}); p {format_p(c['p'], B)}, Holm {format_p(c['p_holm'], B)}; {_verdict(c)}"
            )
        seeds = len(next(iter(cells.values()))["deltas"])
        lines.append(f"| {key} | {seeds} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def interaction_markdown(summary: dict, decoding: str | None = None) -> str:
    """A row per tested model: its ratio and none's over the same seed pairs, the difference with its 95%
    intervals over the seeds (t) and over draws of the test set's blocks."""
    res = _results(summary, decoding)
    if not res["interaction"]:
        return ""
    lines = [
        "| model | seed pairs | ratio | none's ratio | difference | 95% over seeds (t) | 95% over test blocks |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for key, x in res["interaction"].items():
        lines.append(
            f"| {key} | {x['seeds']} | {num(x['ratio'], 3)} | {num(x['base_ratio'], 3)} | "
            f"{x['difference']:+.3f} | {_interval(x['ci_seeds'])} | {_interval(x['ci_test'])} |"
        )
    return "\n".join(lines) + "\n"


def length_markdown(summary: dict, decoding: str | None = None) -> str:
    bl = _results(summary, decoding)["by_length"]
    B = summary["bootstrap"]
    heads = [f"{lab} words (n={n})" for lab, n in zip(bl["labels"], bl["counts"], strict=True)]
    lines = ["| model | seeds | " + " | ".join(heads) + " |", "|---|---:|" + "---:|" * len(heads)]
    for key, rows in bl["rows"].items():
        lines.append(f"| {key} | {rows[0].get('seeds', '-')} | " + " | ".join(_cell(r) for r in rows) + " |")
    for key, cells in bl["tests"].items():
        tests = {c["bucket"]: c for c in cells}
        row = [
            "-"
            if lab not in tests
            else f"{tests[lab]['delta']:+.1f}, Holm p {format_p(tests[lab]['p_holm'], B)}"
            + ("" if tests[lab]["significant"] else " (n.s.)")
            for lab in bl["labels"]
        ]
        lines.append(f"| {key} vs none | {len(cells[0]['deltas'])} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def _sharpness(run: dict) -> str:
    """A run's teacher-forced attention entropy (nats, of log S uniform) and mean largest weight; "-" without."""
    a = run.get("attention_stats")
    if not a:
        return "-"
    return f"{a['entropy']:.2f} of {a['uniform_entropy']:.2f} / {a['max_weight']:.2f}"


def runs_markdown(summary: dict) -> str:
    lines = [
        "| run | seed | BLEU by k | training | ended (UTC) | steps | best step | stopped by | attention entropy / "
        "max weight | CPU | torch | commit | precision |",
        "|---|---:|---|---:|---|---:|---:|---|---|---|---|---|---|",
    ]
    for r in summary["runs"]:
        by_k = "; ".join(
            f"{decoding_text(dec)} " + " / ".join(f"{v:.1f}" for v in values.values())
            for dec, values in r["bleu_by_k"].items()
        )
        commit = (r["commit"] or "-")[:12]
        lines.append(
            f"| {r['name']} | {r['seed']} | {by_k} | {r['train_minutes']:.1f} min | {r.get('trained_at') or '-'} | "
            f"{r['steps']} | {r['best'].get('step')} | {r.get('stopped_by') or '-'} | {_sharpness(r)} | "
            f"{r['cpu']} | {r['torch']} | "
            f"{commit} | {r['precision']} |"
        )
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------- studies side by side
def pairs_markdown(studies: dict[str, dict], decoding: str | None = None) -> str:
    """BLEU by k, a row per model and study (e.g. language pair), the studies of one model together: the
    decoding, seeds, seed mean [95% t-interval over the seeds] at every k, the ratio BLEU(k=K) / BLEU(k=1).
    `decoding` None: each study's headline; a study without `decoding` is left out."""
    chosen = {
        pair: (s, s["results"][decoding or s["headline"]])
        for pair, s in studies.items()
        if (decoding or s["headline"]) in s["results"]
    }
    if not chosen:
        return ""
    first = next(iter(chosen.values()))[0]
    ratio_ks = [m["ratio_k"] for _, res in chosen.values() for m in res["models"].values() if "ratio_k" in m]
    k_top = ratio_ks[0] if ratio_ks else None
    heads = [f"k={s['k']}" + ("" if s["trained"] else " (untrained)") for s in first["sets"]]
    heads += [f"k={k_top} / k=1"] if k_top else []
    lines = [
        "| model | pair | decoding | seeds | " + " | ".join(heads) + " |",
        "|---|---|---|---:|" + "---:|" * len(heads),
    ]
    keys = list(dict.fromkeys(k for _, res in chosen.values() for k in res["models"]))
    for key in keys:
        for pair, (summary, res) in chosen.items():
            m = res["models"].get(key)
            if m is None:
                continue
            name = PAPER_NAMES.get(m["label"], m["label"])
            cells = [_cell(r) for r in m["by_k"]] + ([num(m.get("ratio"))] if k_top else [])
            dec = decoding_text(decoding or summary["headline"])
            lines.append(f"| {name} | {pair} | {dec} | {m['seeds']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def pairs_findings_markdown(studies: dict[str, dict]) -> str:
    """Per study and decoding, per tested model: the interaction (difference [95% over seeds] [95% over test
    blocks]) and the paired tests against none (the largest Holm p over every k, how many k significant)."""
    lines = [
        "| pair | decoding | model | seed pairs | ratio minus none's | 95% over seeds (t) | 95% over test blocks | "
        "vs none at every k: largest Holm p; significant |",
        "|---|---|---|---:|---:|---|---|---|",
    ]
    for pair, summary in studies.items():
        B = summary["bootstrap"]
        for dec, res in summary["results"].items():
            for key, cells in res["paired"].items():
                x = res["interaction"].get(key)
                worst = max(c["p_holm"] for c in cells.values())
                sig = sum(c["significant"] for c in cells.values())
                seeds = len(next(iter(cells.values()))["deltas"])
                inter = (
                    [f"{x['difference']:+.3f}", _interval(x["ci_seeds"]), _interval(x["ci_test"])] if x else ["-"] * 3
                )
                lines.append(
                    f"| {pair} | {decoding_text(dec)} | {key} | {seeds} | " + " | ".join(inter) + " | "
                    f"{format_p(worst, B)}; {sig} of {len(cells)} k |"
                )
    return "\n".join(lines) + "\n"


def training_markdown(studies: dict[str, dict]) -> str:
    """How each model of each study trained, from its runs' records: seeds, steps, epochs and minutes of
    training (least-most over the seeds), and what stopped them (e.g. "early_stopping 5 of 5")."""
    lines = [
        "| pair | model | seeds | steps | epochs | training minutes | stopped by |",
        "|---|---|---:|---|---|---|---|",
    ]

    def span(values: list[float], digits: int = 0) -> str:
        low, high = min(values), max(values)
        return f"{low:.{digits}f}" if low == high else f"{low:.{digits}f}-{high:.{digits}f}"

    for pair, summary in studies.items():
        by_model: dict[str, list[dict]] = {}
        for r in summary["runs"]:
            by_model.setdefault(r.get("attention") or r["name"], []).append(r)
        for attention, runs in by_model.items():
            reasons: dict[str, int] = {}
            for r in runs:
                reasons[r.get("stopped_by") or "not recorded"] = (
                    reasons.get(r.get("stopped_by") or "not recorded", 0) + 1
                )
            stopped = ", ".join(f"{why} {n} of {len(runs)}" for why, n in reasons.items())
            lines.append(
                f"| {pair} | {attention} | {len(runs)} | {span([r['steps'] for r in runs])} | "
                f"{span([r['epochs'] for r in runs])} | {span([r['train_minutes'] for r in runs], 2)} | {stopped} |"
            )
    return "\n".join(lines) + "\n"


def budget_markdown(pairs: dict[str, tuple[dict, dict]], decoding: str = "greedy") -> str:
    """The same study at two training budgets, a row per language pair and model: seeds, the share of its k=1
    BLEU each model keeps at k=K, the interaction against none (difference [95% t-interval over the seeds]),
    mean training steps and minutes. `pairs`: {pair: (first budget's study.json dict, second's)}."""
    lines = [
        "| pair | model | seeds | k=1 BLEU | k=K / k=1 | ratio minus none's [95% over seeds] | steps | minutes |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def both(a: dict | None, b: dict | None, cell) -> str:
        return " -> ".join(cell(x) if x else "-" for x in (a, b))

    for pair, (first, second) in pairs.items():
        res = [s["results"].get(decoding) or {"models": {}, "interaction": {}} for s in (first, second)]
        keys = list(dict.fromkeys([*res[0]["models"], *res[1]["models"]]))
        for key in keys:
            ms = [r["models"].get(key) for r in res]
            xs = [r["interaction"].get(key) for r in res]
            inter = both(*xs, lambda x: f"{x['difference']:+.3f} {_interval(x['ci_seeds'])}") if any(xs) else "-"
            cells = [
                both(*ms, lambda m: str(m["seeds"])),
                both(*ms, lambda m: f"{m['by_k'][0]['bleu']:.1f}"),
                both(*ms, lambda m: num(m.get("ratio"))),
                inter,
                both(*ms, lambda m: num(m.get("steps"), 0)),
                both(*ms, lambda m: num(m.get("train_minutes"), 1)),
            ]
            lines.append(f"| {pair} | {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
