"""BLEU by source length: every evaluated item of a study (every k pooled) bucketed by its source words.

    edges, ok = choose_edges(words, min_bucket=80)     # the finest candidate edges with enough items a bucket
    table = length_rows(groups, sets, edges, decoding, samples, seed)

Per model and bucket: the seeds' mean BLEU, a t-interval over the seeds and a percentile interval over draws
of the bucket's items; per tested model, paired tests against the baseline (Holm over buckets and models).
The pooled items share content across k (a caption is in one item of every k), so the items of a bucket are
not independent draws and these intervals and tests are indicative only; the per-k tables are the study.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from nmt.metrics import bucket_labels, bucket_of
from nmt.study.records import StudyRun
from nmt.study.resampling import Draws
from nmt.study.stats import BASELINE, Output, add_holm, paired_cell, seed_cell

CANDIDATE_EDGES = (
    [0, 10, 20, 30, 40, 50],
    [0, 10, 20, 30, 40],
    [0, 15, 25, 35, 45],
    [0, 10, 20, 30],
    [0, 15, 25, 35],
    [0, 20, 30],
)  # finest first
LENGTH_SEED_OFFSET = 3  # bucket b draws with seed + 3 + b: apart from the per-k draws


def choose_edges(words: Sequence[int], min_bucket: int) -> tuple[list[int], bool]:
    """(the finest candidate whose every bucket holds >= min_bucket items, True); when none does, (the one
    whose smallest bucket is largest, False)."""

    def smallest(edges: Sequence[int]) -> int:
        counts = [0] * len(edges)
        for n in words:
            counts[bucket_of(n, edges)] += 1
        return min(counts)

    for edges in CANDIDATE_EDGES:
        if smallest(edges) >= min_bucket:
            return list(edges), True
    return list(max(CANDIDATE_EDGES, key=smallest)), False


def pooled_words(run: StudyRun, sets: Sequence[str], decoding: str) -> list[int]:
    """Source words of every item of `sets`, in order (the windows of exactly k of each)."""
    return [n for name in sets for n in run.outputs[decoding][name].words]


def length_rows(
    groups: Sequence[tuple[str, list[StudyRun]]],
    sets: Sequence[str],
    edges: list[int],
    decoding: str,
    samples: int,
    seed: int,
) -> dict:
    """{"edges", "labels", "counts", "rows": {model: [cell per bucket]}, "tests": {model: [cell per bucket]}}
    for one decoding; `groups` as nmt.study.summary.group_runs gives them (runs holding `decoding`)."""
    first = groups[0][1][0]
    pooled = [(name, i) for name in sets for i in range(len(first.outputs[decoding][name].references))]
    words = pooled_words(first, sets, decoding)
    members: list[list[int]] = [[] for _ in edges]
    for j, n in enumerate(words):
        members[bucket_of(n, edges)].append(j)
    rows: dict[str, list[dict]] = {}
    tests: dict[str, list] = {}
    baseline = next((g for _, g in groups if g[0].attention == BASELINE), None)

    def stacked(run: StudyRun, idx: list[int]) -> Output:
        """The run's outputs of the pooled items `idx`, as one Output."""
        picks = [(run.outputs[decoding][pooled[j][0]], pooled[j][1]) for j in idx]
        return Output(
            [o.hypotheses[i] for o, i in picks],
            [o.references[i] for o, i in picks],
            [words[j] for j in idx],
            np.stack([o.stats[i] for o, i in picks]) if picks else np.zeros((0, 10)),
        )

    for b, idx in enumerate(members):
        w = Draws.of(len(idx), samples, seed + LENGTH_SEED_OFFSET + b).counts if idx else None
        for key, g in groups:
            row = {"bucket": bucket_labels(edges)[b], "lo": edges[b], "n": len(idx)}
            row.update(seed_cell([stacked(r, idx) for r in g], w) if idx else {"bleu": None, "seeds": len(g)})
            rows.setdefault(key, []).append(row)
            if baseline is not None and g is not baseline and idx:
                base = {str(r.seed): r for r in baseline}
                pairs = [(stacked(r, idx), stacked(base[str(r.seed)], idx)) for r in g if str(r.seed) in base]
                if pairs:
                    tests.setdefault(key, []).append({"bucket": row["bucket"], **paired_cell(pairs, w)})
    add_holm([c for cells in tests.values() for c in cells], samples)
    return {
        "edges": edges,
        "labels": bucket_labels(edges),
        "counts": [len(m) for m in members],
        "rows": rows,
        "tests": tests,
    }
