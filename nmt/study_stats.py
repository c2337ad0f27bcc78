"""The bottleneck study's statistics: seed means with seeds x sentences bootstrap intervals, and paired
significance tests of every group against the fixed-vector baseline (attention=none).

    out = Output.of(hypotheses, references, sources)          # one run's translations of one split
    cell = seed_cell([out_seed1, out_seed2], idx, samples=1000)  # {"bleu", "low", "high", "seed_bleu"}
    test = paired_cell([(out_luong_s1, out_none_s1)], idx, 1000)   # {"delta", "p", "p_max"}

Intervals (nmt.metrics.bootstrap_scores): each of `samples` replicates resamples the cell's sentences (the
same draw for every run) and the group's seeds, both with replacement, and averages the drawn seeds' corpus
BLEU; the 95% interval is the 2.5th-97.5th percentile. With one seed it is the plain bootstrap.

Tests (sacrebleu.significance.PairedTest, test_type="bs": Koehn's paired bootstrap as in Moses, two-sided,
`samples` resamples): one test per seed pair, seed s of the group against seed s of `none` (the same seed
gives the same data order and, where shapes agree, the same starting weights), on the same sentences. A
cell reports every pair's p-value and the largest; "significant in every seed pair" is p_max < 0.05.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from nmt.metrics import bleu_from_statistics, bleu_statistics, bootstrap_scores, percentile_interval

if TYPE_CHECKING:
    from nmt.study_runs import Run

BASELINE = "none"  # the attention every other group is tested against
SEED = 12345  # one resampling seed for every cell: runs on the same sentences get the same resamples
TEST = (
    "paired bootstrap resampling (sacrebleu.significance.PairedTest, test_type='bs', two-sided, "
    "{samples} resamples), one test per seed pair: seed s of the row against seed s of {baseline} "
    "on the same sentences"
)


@dataclass
class Output:
    """One run's translations of one evaluated split, N sentences."""

    hypotheses: list[str]
    references: list[str]
    words: list[int]  # source words per sentence
    stats: np.ndarray  # (N, 10) BLEU statistics per sentence (nmt.metrics.bleu_statistics)

    @classmethod
    def of(cls, hypotheses: Sequence[str], references: Sequence[str], sources: Sequence[str]) -> Output:
        return cls(
            list(hypotheses),
            list(references),
            [len(s.split()) for s in sources],
            bleu_statistics(hypotheses, references),
        )

    def bleu(self, idx: Sequence[int]) -> float:
        """Corpus BLEU of the sentences `idx`."""
        return float(bleu_from_statistics(self.stats[list(idx)].sum(0)))


def seed_cell(outputs: Sequence[Output], idx: Sequence[int], samples: int) -> dict:
    """A group's BLEU on the sentences `idx` of one split, one Output per seed: {"bleu": the seeds' mean,
    "low", "high": 95% seeds x sentences bootstrap interval (None when samples = 0 or idx is empty),
    "seed_bleu": [per seed]} (2 decimals)."""
    if not idx:
        return {"bleu": None, "low": None, "high": None, "seed_bleu": [None] * len(outputs)}
    per_seed = [o.bleu(idx) for o in outputs]
    low = high = None
    if samples > 0:
        low, high = percentile_interval(bootstrap_scores([o.stats[list(idx)] for o in outputs], samples, SEED))
        low, high = round(low, 2), round(high, 2)
    return {
        "bleu": round(sum(per_seed) / len(per_seed), 2),
        "low": low,
        "high": high,
        "seed_bleu": [round(b, 2) for b in per_seed],
    }


def paired_p(system: Sequence[str], baseline: Sequence[str], references: Sequence[str], samples: int) -> float:
    """Two-sided p-value of sacrebleu's paired bootstrap test (public API) for system against baseline.

    sacrebleu counts resampled differences strictly greater than the observed one, so two systems whose
    BLEU is the same (identical outputs, or both 0 in every resample) would get 1 / (samples + 1), a
    "significant" difference; an observed difference of 0 is no evidence of one, so it gets p = 1.
    """
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    if list(system) == list(baseline):
        return 1.0
    test = PairedTest(
        [("baseline", list(baseline)), ("system", list(system))],
        {"BLEU": BLEU()},
        [list(references)],
        test_type="bs",
        n_samples=samples,
    )
    _, scores = test()
    base, result = next(v for k, v in scores.items() if k != "System")
    return 1.0 if result.score == base.score else float(result.p_value)


def paired_cell(pairs: Sequence[tuple[Output, Output]], idx: Sequence[int], samples: int) -> dict | None:
    """Paired tests on the sentences `idx`, one per (system, baseline) seed pair: {"delta": mean BLEU
    difference system - baseline, "p": [per pair], "p_max": the largest} (None when idx is empty)."""
    if not idx or not pairs or samples <= 0:
        return None
    idx = list(idx)
    deltas, ps = [], []
    for system, baseline in pairs:
        deltas.append(system.bleu(idx) - baseline.bleu(idx))
        ps.append(
            paired_p(
                [system.hypotheses[i] for i in idx],
                [baseline.hypotheses[i] for i in idx],
                [baseline.references[i] for i in idx],
                samples,
            )
        )
    return {"delta": round(sum(deltas) / len(deltas), 2), "p": [round(p, 4) for p in ps], "p_max": round(max(ps), 4)}


def pair_seeds(system: Sequence[Run], baseline: Sequence[Run]) -> list[tuple[Run, Run]]:
    """Runs paired by seed: the seeds both groups have; when they share none, in seed order (the first
    seed with the first, ...) up to the smaller group."""
    seed = lambda r: r.config.get("seed")  # noqa: E731
    by_seed = {seed(r): r for r in baseline}
    shared = [(r, by_seed[seed(r)]) for r in system if seed(r) in by_seed]
    if shared:
        return shared
    key = lambda r: str(seed(r))  # noqa: E731
    return list(zip(sorted(system, key=key), sorted(baseline, key=key), strict=False))


def bucket_members(words: Sequence[int], edges: Sequence[int]) -> list[list[int]]:
    """Sentence indices per source-length bucket (nmt.metrics.bucket_of's buckets)."""
    from nmt.metrics import bucket_of

    members: list[list[int]] = [[] for _ in edges]
    for i, n in enumerate(words):
        members[bucket_of(n, edges)].append(i)
    return members


def window_rows(runs: Sequence[Run], windows: Sequence[str], samples: int) -> list[dict]:
    """A group's BLEU per window size k (`windows` = ["test_k1", ..., "test_kK"]): {"k", "split", "n"
    windows, "source_words" (mean per window), "bleu", "low", "high", "seed_bleu"}."""
    rows = []
    for k, split in enumerate(windows, start=1):
        outs = [r.outputs[split] for r in runs]
        n = len(outs[0].words)
        rows.append(
            {
                "k": k,
                "split": split,
                "n": n,
                "source_words": round(sum(outs[0].words) / max(n, 1), 1),
                **seed_cell(outs, range(n), samples),
            }
        )
    return rows


def mean(values: Sequence[float | None], digits: int = 2) -> float | None:
    """The mean rounded to `digits` (None when a value is missing)."""
    return None if not values or any(v is None for v in values) else round(sum(values) / len(values), digits)


def summarise(
    label: str, runs: Sequence[Run], split: str, edges: Sequence[int], windows: Sequence[str], samples: int
) -> dict:
    """One group's numbers on `split`: seed means with seeds x sentences intervals, overall and per length
    bucket; per window size k too when `windows` names the test_k<k> sets (and the ratio BLEU(K) / BLEU(1))."""
    outs = [r.outputs[split] for r in runs]
    rows = []
    for k, idx in enumerate(bucket_members(outs[0].words, edges)):
        per = [r.result["by_length"][k] for r in runs]
        rows.append(
            {
                **{key: per[0][key] for key in ("bucket", "lo", "hi", "n")},
                **seed_cell(outs, idx, samples),
                "chrf": mean([p["chrf"] for p in per]),
            }
        )
    first, config = runs[0], runs[0].config
    summary = {
        "label": label,
        "attention": first.attention,
        "query": config.get("attention", {}).get("query"),
        "input_feeding": config.get("model", {}).get("input_feeding"),
        "seeds": [r.config.get("seed") for r in runs],
        "runs": [str(r.path) for r in runs],
        "sentences": first.result["sentences"],
        **seed_cell(outs, range(len(outs[0].words)), samples),
        **{m: mean([r.result[m] for r in runs]) for m in ("chrf", "ter")},
        "parameters": first.parameters,
        "steps": round(sum(r.step for r in runs) / len(runs)),
        "epochs": mean([r.epoch for r in runs], 1),
        "train_minutes": mean([r.minutes for r in runs]),
        "by_length": rows,
    }
    if windows:
        summary["by_window"] = window_rows(runs, windows, samples)
        ends = summary["by_window"][0]["bleu"], summary["by_window"][-1]["bleu"]
        summary["window_ratio"] = round(ends[1] / ends[0], 3) if ends[0] else None
    return summary


def add_tests(
    summaries: list[dict], groups: Sequence[tuple[str, list[Run]]], split: str, windows: Sequence[str], samples: int
) -> tuple[dict | None, list[str]]:
    """Test every group against the `none` group (the one whose config differs least from it, when there
    are several) overall, per length bucket and per window size; each summary's cells get a "test"
    (None for the baseline itself). Returns (summary["tests"], notes)."""
    from nmt.study_runs import differing_keys

    for s in summaries:
        s["test"] = None
        for row in (*s["by_length"], *s.get("by_window", [])):
            row["test"] = None
    nones = [(label, runs) for label, runs in groups if runs[0].attention == BASELINE]
    if not nones:
        return None, ["No paired tests: no group has attention=none, the baseline they compare against."]
    if samples <= 0:
        return None, ["No paired tests (--bootstrap 0)."]
    notes, pairs_of = [], {}
    if len(nones) > 1:
        notes.append(
            "Several groups have attention=none: each group was tested against the one whose config "
            "differs least from its own (study.json: tests.pairs)."
        )
    for summary, (label, runs) in zip(summaries, groups, strict=True):
        if runs[0].attention == BASELINE:
            continue
        base_label, base = min(
            nones,
            key=lambda g: len(
                differing_keys([runs[0].config, g[1][0].config], lambda k: k.startswith("attention.") or k == "seed")
            ),
        )
        if runs[0].outputs[split].references != base[0].outputs[split].references:
            notes.append(f"{label} was not tested against {base_label}: they were evaluated on different sentences.")
            continue
        pairs = pair_seeds(runs, base)
        pairs_of[label] = {
            "baseline": base_label,
            "seeds": [[a.config.get("seed"), b.config.get("seed")] for a, b in pairs],
        }
        if any(a.config.get("seed") != b.config.get("seed") for a, b in pairs):
            notes.append(f"{label} and {base_label} share no seed: their runs were paired in seed order.")
        elif len(pairs) < max(len(runs), len(base)):
            notes.append(
                f"{label} and {base_label}: only their shared seeds were paired "
                f"({', '.join(str(a.config.get('seed')) for a, _ in pairs)})."
            )
        outs = [(a.outputs[split], b.outputs[split]) for a, b in pairs]
        n = len(outs[0][0].words)
        summary["test"] = paired_cell(outs, range(n), samples)
        members = bucket_members(outs[0][0].words, [r["lo"] for r in summary["by_length"]])
        for row, idx in zip(summary["by_length"], members, strict=True):
            row["test"] = paired_cell(outs, idx, samples)
        for row in summary.get("by_window", []):
            w = [(a.outputs[row["split"]], b.outputs[row["split"]]) for a, b in pairs]
            row["test"] = paired_cell(w, range(row["n"]), samples)
    tests = {"method": TEST.format(samples=samples, baseline=BASELINE), "samples": samples, "pairs": pairs_of}
    return tests, notes
