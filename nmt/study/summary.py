"""study.json's numbers, computed from the runs' records alone (nmt.study.records.StudyRun).

    summary = summarise(runs, StudySettings(), notes)

Per decoding (greedy, beam 5: every decoding the records hold; the headline is greedy where every run has
it) and per model: BLEU at every window size k (seed mean, t-interval over the seeds, test interval over
draws of the windows), the ratio BLEU(k=K) / BLEU(k=1) at the longest trained K, paired tests against the
baseline (none) at every k, the interaction (a model's ratio minus the baseline's, seed by seed) and BLEU by
source length. What is drawn at each k: nmt.study.resampling; the statistics: nmt.study.stats.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np

from nmt.errors import DataError
from nmt.study.checks import method
from nmt.study.configs import decoder_label, flatten
from nmt.study.lengths import choose_edges, length_rows, pooled_words
from nmt.study.records import StudyRun, exact_windows, set_outputs
from nmt.study.resampling import Draws, block_weights, window_clusters
from nmt.study.stats import BASELINE, add_holm, interaction, paired_cell, ratio, seed_cell, t_interval

TEST_METHOD = (
    "paired bootstrap (sacrebleu's two-sided rule) at each k on draws of that k's windows, one test per seed "
    "pair on the same draws; a cell combines its seed pairs by their largest p and is significant only when "
    "every seed pair's difference has the same sign; Holm's correction over every k and model of one decoding"
)


def group_runs(runs: Sequence[StudyRun]) -> list[tuple[str, list[StudyRun]]]:
    """Runs of one model (config without the seed) together, the fixed-vector baseline first, each group's
    runs by seed; keyed by the attention's name (its decoder label where two groups share a name)."""
    groups: dict[str, list[StudyRun]] = {}
    for run in runs:
        key = json.dumps({k: v for k, v in flatten(run.config).items() if k.startswith("attention.")}, sort_keys=True)
        groups.setdefault(key, []).append(run)
    members = sorted(
        groups.values(), key=lambda g: (g[0].attention != BASELINE, g[0].attention, decoder_label(g[0].config))
    )
    names = [g[0].attention for g in members]
    return [
        (
            g[0].attention if names.count(g[0].attention) == 1 else decoder_label(g[0].config),
            sorted(g, key=lambda r: str(r.seed)),
        )
        for g in members
    ]


def decodings_in_order(runs: Sequence[StudyRun]) -> list[str]:
    """Every decoding the runs hold, the headline first: greedy where every run has it, else the first (by
    beam size) that every run has; the others by beam size."""
    beam = {d: int(s.get("beam_size", 1)) for r in runs for d, s in r.decodings.items()}
    names = sorted(beam, key=lambda d: (beam[d], d))
    common = [d for d in names if all(d in r.outputs for r in runs)]
    if not common:
        raise DataError("no decoding is in every record (e.g. greedy); make the records again with --beam 1,5")
    return [common[0], *(d for d in names if d != common[0])]


def _mean(values: Sequence[float]) -> float:
    """Unrounded, as every figure in study.json: a table rounds once, when it prints."""
    return float(np.mean(values))


def model_row(key: str, members: list[StudyRun], decoding: str, sets: list, weights: dict, trained_k: int) -> dict:
    by_k = []
    for name, s in sets:
        outs = [r.outputs[decoding][name] for r in members]
        by_k.append(
            {
                "k": s["k"],
                "set": name,
                "n": len(outs[0].references),
                "source_words": _mean(outs[0].words),
                "trained": s["k"] <= trained_k,
                **seed_cell(outs, weights[name]),
            }
        )
    first = members[0]
    return {
        "label": decoder_label(first.config),
        "attention": first.attention,
        "query": first.config.get("attention", {}).get("query"),
        "input_feeding": first.config.get("model", {}).get("input_feeding"),
        "seeds": len(members),
        "seed_list": [r.seed for r in members],
        "runs": [r.name for r in members],
        "parameters": first.record["parameters"],
        "steps": _mean([r.record["steps"] for r in members]),
        "epochs": _mean([r.record["epochs"] for r in members]),
        "train_minutes": _mean([r.record["train_minutes"] for r in members]),
        "chrf": _mean([set_outputs(r.record, sets[0][0])[decoding]["chrf"] for r in members]),
        "bleu_by_k": {str(row["k"]): row["bleu"] for row in by_k},
        "by_k": by_k,
    }


def decoding_results(runs: Sequence[StudyRun], decoding: str, layout: dict, settings, notes: list[str]) -> dict:
    """{"models", "paired", "interaction", "by_length"} of one decoding, over the runs that hold it."""
    groups = group_runs([r for r in runs if decoding in r.outputs])
    sets, weights, blocks, top = layout["sets"], layout["weights"], layout["blocks"], layout["top"]
    one = sets[0][0]
    tag = "" if decoding == layout["headline"] else f"{decoding}: "
    baseline = next((g for key, g in groups if g[0].attention == BASELINE), None)
    models, paired, inter = {}, {}, {}
    for key, members in groups:
        m = models[key] = model_row(key, members, decoding, sets, weights, layout["trained_k"])
        pairs = {r.seed: (r.outputs[decoding][one], r.outputs[decoding][top]) for r in members} if top else {}
        if top and not all(p[0].bleu(blocks[0]) > 0 for p in pairs.values()):
            notes.append(f"{tag}{key} has BLEU 0 at k=1 for a seed: no ratio BLEU(k=K) / BLEU(k=1), no interaction.")
        elif top:
            per_seed = [ratio(p, blocks[0]) for p in pairs.values()]
            interval = t_interval(per_seed)
            m.update(ratio_k=layout["k_top"], ratio=_mean(per_seed), ratio_seeds=[float(x) for x in per_seed])
            m["ratio_ci_seeds"] = [float(x) for x in interval] if interval else None
        if baseline is None or members is baseline:
            continue
        base_by_seed = {str(r.seed): r for r in baseline}
        shared = [(r, base_by_seed[str(r.seed)]) for r in members if str(r.seed) in base_by_seed]
        if not shared:
            notes.append(f"{tag}{key} shares no seed with {BASELINE}: not tested (seeds are paired by recorded seed).")
            continue
        paired[key] = {
            str(s["k"]): {
                "set": name,
                **paired_cell(
                    [(a.outputs[decoding][name], b.outputs[decoding][name]) for a, b in shared], weights[name]
                ),
            }
            for name, s in sets
        }
        if "ratio" in m and all(b.outputs[decoding][one].bleu(blocks[0]) > 0 for _, b in shared):
            both = [(a.outputs[decoding], b.outputs[decoding]) for a, b in shared]
            inter[key] = {
                **interaction([(a[one], a[top]) for a, _ in both], [(b[one], b[top]) for _, b in both], blocks),
                "k": layout["k_top"],
            }
    add_holm([cell for cells in paired.values() for cell in cells.values()], settings.bootstrap)
    by_length = length_rows(groups, [n for n, _ in sets], layout["edges"], decoding, settings.bootstrap, settings.seed)
    return {"models": models, "paired": paired, "interaction": inter, "by_length": by_length}


def study_layout(runs: Sequence[StudyRun], settings, notes: list[str]) -> dict:
    """What every decoding shares: the sets by k, each set's draws (its windows' resampling units), the
    interaction's blocks, the length buckets' edges, the headline decoding."""
    first = runs[0].record
    sets = sorted(first["sets"].items(), key=lambda kv: kv[1]["k"])
    trained_k = int(first["config"].get("data", {}).get("window") or 1)
    units = first.get("units")  # per pair of the split (Bible chapters), else None: each pair its own
    starts = {name: exact_windows(s)[1] for name, s in sets}
    clusters = {name: window_clusters(starts[name], s["k"], units) for name, s in sets}
    weights = {
        name: Draws.of(int(c.max()) + 1, settings.bootstrap, settings.seed).weights(c) for name, c in clusters.items()
    }
    k_top = min(trained_k, sets[-1][1]["k"]) if len(sets) > 1 else 1
    top = next((name for name, s in sets if s["k"] == k_top), None) if k_top > 1 else None
    blocks = block_weights(starts[top], k_top, units, settings.bootstrap, settings.seed) if top else None
    decodings = decodings_in_order(runs)
    words = pooled_words(runs[0], [n for n, _ in sets], decodings[0])
    edges = settings.edges
    if edges is None:
        edges, ok = choose_edges(words, settings.min_bucket)
        if not ok:
            notes.append(f"No candidate bucket edges give {settings.min_bucket} items in every bucket; using {edges}.")
    n_pairs = len(sets[0][1]["references"]) if sets[0][1]["k"] == 1 else None
    rows = [
        {
            "k": s["k"],
            "set": name,
            "n": len(starts[name]),
            "left_out": None if n_pairs is None else n_pairs - s["k"] * len(starts[name]),
            "units": int(clusters[name].max()) + 1,
            "source_words": _mean(runs[0].outputs[decodings[0]][name].words),
            "trained": s["k"] <= trained_k,
        }
        for name, s in sets
    ]
    return {
        "sets": sets,
        "rows": rows,
        "trained_k": trained_k,
        "weights": weights,
        "k_top": k_top,
        "top": top,
        "blocks": blocks,
        "edges": edges,
        "decodings": decodings,
        "headline": decodings[0],
    }


def run_row(run: StudyRun) -> dict:
    r = run.record
    made = r.get("provenance") or {}
    decodings = run.decodings
    return {
        "name": run.name,
        "attention": run.attention,
        "seed": run.seed,
        "decodings": list(run.outputs),
        "bleu_by_k": {
            dec: {str(r["sets"][name]["k"]): float(o.bleu()) for name, o in sets.items()}
            for dec, sets in run.outputs.items()
        },
        "train_minutes": r["train_minutes"],
        "trained_at": r.get("trained_at"),
        "steps": r["steps"],
        "epochs": r["epochs"],
        "stopped_by": r.get("stopped_by"),  # None in records made before it was kept
        "attention_stats": r.get("attention_stats"),  # teacher-forced sharpness (nmt.study.attention_stats)
        "best": r["best"],
        "finished": r["finished"],
        "cpu": made.get("cpu_model") or f"{r['recorded_by'].get('cpu_model')} (recorded there; training's not stored)",
        "torch": made.get("torch") or r["recorded_by"].get("torch"),
        "commit": made.get("commit"),
        "precision": next(iter(decodings.values())).get("precision"),
        "learning_curve": r["learning_curve"],
    }


def seed_notes(results: dict, headline: str) -> list[str]:
    """Where a decoding other than the headline lacks some of a model's seeds: how many it has."""
    notes = []
    full = {key: m["seeds"] for key, m in results[headline]["models"].items()}
    for dec, res in results.items():
        short = [
            f"{key} {m['seeds']} of {full.get(key)}" for key, m in res["models"].items() if m["seeds"] != full.get(key)
        ]
        if short:
            notes.append(f"{dec} has only some seeds of a model: {', '.join(short)} (each row says how many).")
    return notes


def summarise(runs: Sequence[StudyRun], settings, notes: list[str]) -> dict:
    """study.json's dict, computed from the runs' records alone. `settings`: nmt.study.build.StudySettings."""
    layout = study_layout(runs, settings, notes)
    results = {dec: decoding_results(runs, dec, layout, settings, notes) for dec in layout["decodings"]}
    headline = layout["headline"]
    groups = group_runs(runs)
    if any(len(g) == 1 for _, g in groups):
        notes.append("One seed for some models: their rows have no interval over seeds, only over the test set.")
    notes += seed_notes(results, headline)
    notes += [
        f"`{r.name}` had not finished training (no metrics.json) when it was recorded."
        for r in runs
        if not r.record["finished"]
    ]
    notes += [
        f"k = {row['k']}: {row['n']} windows of exactly {row['k']}; the last {row['left_out']} "
        f"pair{'s' if row['left_out'] != 1 else ''} left out."
        for row in layout["rows"]
        if row["left_out"]
    ]
    beyond = [row["k"] for row in layout["rows"] if not row["trained"]]
    if len(layout["sets"]) > 1 and beyond:
        notes.append(
            f"k = {', '.join(map(str, beyond))}: longer than any training example (at most {layout['trained_k']} "
            "joined); these columns measure length generalisation and are kept apart from the trained range."
        )
    first = runs[0].record
    with_decoding = {dec: next(r for r in runs if dec in r.outputs) for dec in layout["decodings"]}
    return {
        "corpus": first["corpus"],
        "split": first["split"],
        "sets": layout["rows"],
        "trained_k": layout["trained_k"],
        "headline": headline,
        "decodings": {dec: method(r.decodings[dec]) for dec, r in with_decoding.items()},
        "signatures": first.get("signatures"),
        "bootstrap": settings.bootstrap,
        "resampling": {
            "seed": settings.seed,
            "samples": settings.bootstrap,
            "unit": "chapter" if first.get("units") else "window",
            "seeds": "t-interval over the seeds' values (S - 1 degrees of freedom); seeds are not resampled",
            "interaction": f"blocks of {layout['k_top']} pairs (one window of {layout['k_top']} and its "
            f"{layout['k_top']} single pairs) drawn together at k=1 and k={layout['k_top']}",
            "test": TEST_METHOD,
        },
        "overlap": first["overlap"],
        "results": results,
        "runs": [run_row(r) for _, g in groups for r in g],
        "long": {key: g[0].record["long"] for key, g in groups},
        "notes": notes,
    }
