"""What one study may compare: the split it studies and the records it combines.

    check_split("test")            # ConfigError for train, valid (it chose each best.pt) and valid_k<k>
    check_records(records)         # DataError for runs given twice, other references, other decoding, ...

Refused: the training split, the split that chose each checkpoint (valid and its windows), a split given
twice, runs that differ in more than the attention and the seed, records evaluated on other references (the
windows of exactly k compared, so a version-1 record's short last window does not count), a decoding made
with other settings, and the same run or the same (model, seed) twice.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from nmt.errors import ConfigError, DataError
from nmt.study.configs import check_comparable
from nmt.study.records import exact_windows, record_decodings, references_sha256

SELECTION = re.compile(r"valid(_k\d+)?")  # the splits training validated on (best.pt, early stopping)
# the machine's, not the method's: the output does not depend on them (batch_tokens: nmt.translator sorts and
# batches sentences so that no output depends on its batch; 8,000 before the default became 4,000, now 8,000 for
# greedy search; kernels: the C++ decoder step computes the same numbers to rounding, tested to give the same
# hypotheses as the torch operations)
DECODING_MAY_DIFFER = (
    "precision",
    "precision_reason",
    "max_src_pieces",
    "device",
    "batch_tokens",
    "kernels",
    "kernels_resolved",
    "plan",
)


def check_split(split: str) -> str:
    """The split to study: one held-out split, not train and not the one that chose each checkpoint."""
    parts = split.split("+")
    if len(parts) != len(set(parts)):
        raise ConfigError(f"--split {split}: a split is given twice; give one held-out split, e.g. --split test")
    if len(parts) > 1:
        raise ConfigError(f"--split {split}: give one held-out split (its windows <split>_k<k> come with it)")
    if split == "train" or split.startswith("train_"):
        raise ConfigError(f"--split {split}: the runs trained on it; study a held-out split, e.g. --split test")
    if SELECTION.fullmatch(split):
        raise ConfigError(
            f"--split {split}: valid chose each run's best.pt (and timed its early stopping and learning-rate "
            "cuts), so a study on it favours every run by its luckiest checkpoint; use --split test"
        )
    return split


def method(settings: dict) -> dict:
    """A decoding's settings without those of the machine (DECODING_MAY_DIFFER)."""
    return {k: v for k, v in settings.items() if k not in DECODING_MAY_DIFFER}


def exact_sha256(s: dict) -> str:
    """sha256 of an evaluated set's references on its windows of exactly k pairs."""
    keep, _ = exact_windows(s)
    return references_sha256([s["references"][i] for i in keep])


def check_records(records: Sequence[dict]) -> None:
    """Records one study may combine: distinct runs and (model, seed)s, the same split, sets and references,
    each decoding made the same way, configs that differ only in the attention and the seed."""
    names = [r["name"] for r in records]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice:
        raise DataError(f"run {twice} is given twice (as a run directory or a record); give each run once")
    first = records[0]
    for r in records[1:]:
        if r["split"] != first["split"] or sorted(r["sets"]) != sorted(first["sets"]):
            raise DataError(
                f"records {first['name']} and {r['name']} were evaluated on different sets "
                f"({', '.join(sorted(first['sets']))} / {', '.join(sorted(r['sets']))}); evaluate them on one split"
            )
        for name, s in r["sets"].items():
            ours, theirs = exact_sha256(first["sets"][name]), exact_sha256(s)
            if ours != theirs:
                raise DataError(
                    f"records {first['name']} and {r['name']} have different references for {name} "
                    f"(sha256 {ours[:12]} / {theirs[:12]}); a study compares translations of the same test set"
                )
    seen_decodings: dict[str, tuple[str, dict]] = {}
    for r in records:
        for dec, settings in record_decodings(r).items():
            before = seen_decodings.setdefault(dec, (r["name"], method(settings)))
            if before[1] != method(settings):
                raise DataError(
                    f"records {before[0]} and {r['name']} were decoded differently for {dec} "
                    f"({before[1]} / {method(settings)})"
                )
    check_comparable([r["config"] for r in records], names)
    seen: dict = {}
    for r in records:
        key = (json.dumps(r["config"].get("attention"), sort_keys=True), r["config"].get("seed"))
        if key in seen:
            raise DataError(
                f"runs {seen[key]} and {r['name']} are the same model with the same seed "
                f"({r['config'].get('seed')}); keep one"
            )
        seen[key] = r["name"]
