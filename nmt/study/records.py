"""A study record: one finished run's translations and facts in one self-describing file (JSON, gzip).

    record = make_record(read_run_dir(run), corpus, "test", RecordSettings(beams=(1, 5)))
    write_record(record, Path("records/bahdanau_seed1.json.gz"))
    record = read_record(Path("records/bahdanau_seed1.json.gz"))     # version 1 or 2
    run = StudyRun.of(record)                          # what nmt.study.summary computes with

Run directories (checkpoints, hundreds of MB) are scratch; records are what a study keeps, and every table, plot
and test of a study is built from records alone, so records made on different days and machines combine. A record
holds: the resolved training config; what trained it (commit, CPU, torch: `provenance`, from the checkpoint), when
it ended, and what made the record; the settings that broke exactness when it was resumed with
trainer.resume_changes=allow (`resumed_with_changes`, nmt.resume; empty for an exact run); wall time, steps,
epochs, why training ended (`stopped_by`: early_stopping where validation BLEU's plateau ended it), every
validation's BLEU (`validations`, absent from older records), the chosen checkpoint's validation score and step,
the validation learning curve by length; the split's resampling units (Bible chapters; else each pair is its own
unit); the split's overlap with the training text; the attention's sharpness on the split, teacher-forced
(`attention_stats`); one long input's attention weights (greedy); and for the study's split and each of its windows
`<split>_k<k>`: the references (with their sha256), the source words, the window sizes and the pairs left out, and
the detokenized hypotheses of every decoding.

Version 2 (this one) decodes several ways: `decodings` maps a name (`greedy`, `beam5`: decoding_name) to its
settings, and each set's `outputs` maps the same names to {hypotheses, bleu, chrf, ter}. Version 1 records
(greedy only: one `decoding`, each set's `hypotheses`, bleu, chrf, ter) are read as they are: record_decodings
and set_hypotheses read both, and a record is written back unchanged, so a study rebuilt from version-1
records rewrites the same files. Version-1 records cut a split's last n mod k pairs into a short window; the
study leaves such windows out (exact_windows), as version 2 never makes them.
"""

from __future__ import annotations

import gzip
import hashlib
import itertools
import json
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

from nmt.errors import DataError
from nmt.study.runs import RunInfo, learning_curve, validation_curve
from nmt.study.stats import Output

FORMAT = "nmt-study-record"
VERSION = 2
Pair = tuple[str, str]
DEFAULT_BEAMS = (1, 5)  # greedy and beam 5: the study reports both


@dataclass
class RecordSettings:
    device: str = "cpu"
    beams: tuple[int, ...] = DEFAULT_BEAMS  # one decoding per beam size (1: greedy)
    long_words: int = 40  # the attention heatmap's input: the longest evaluated source with at most this many words


def decoding_name(settings: dict) -> str:
    """`greedy` for beam size 1, else `beam<size>` (e.g. beam5)."""
    beam = int(settings.get("beam_size", 1))
    return "greedy" if beam == 1 else f"beam{beam}"


def record_decodings(record: dict) -> dict[str, dict]:
    """{name: settings} of every decoding a record holds (a version-1 record: its one decoding)."""
    if "decodings" in record:
        return record["decodings"]
    return {decoding_name(record["decoding"]): record["decoding"]}


def set_outputs(record: dict, name: str) -> dict[str, dict]:
    """{decoding: {hypotheses, bleu, chrf, ter}} of one evaluated set of a record (version 1 or 2)."""
    s = record["sets"][name]
    if "outputs" in s:
        return s["outputs"]
    return {decoding_name(record["decoding"]): {k: s[k] for k in ("hypotheses", "bleu", "chrf", "ter")}}


def exact_windows(s: dict) -> tuple[list[int], list[int]]:
    """(indices, starts) of one evaluated set's windows of exactly k pairs: their positions in the set and
    the first pair each holds. A version-1 record may hold a short last window (a unit's rest); it is left
    out here. Without `sizes` every item is one pair."""
    sizes = s.get("sizes") or [1] * len(s["references"])
    starts = [0, *itertools.accumulate(sizes)][:-1]
    keep = [i for i, n in enumerate(sizes) if n == s["k"]]
    return keep, [starts[i] for i in keep]


def references_sha256(references: list[str]) -> str:
    return hashlib.sha256("\n".join(references).encode()).hexdigest()


def window_sets(corpus, split: str) -> list[str]:
    """[`<split>_k1`, ..., `<split>_kK`]: the split's window sets, K as far as they run unbroken."""
    out: list[str] = []
    while f"{split}_k{len(out) + 1}" in corpus.splits:
        out.append(f"{split}_k{len(out) + 1}")
    return out


def overlap(corpus, split: str) -> dict:
    """How many pairs of `split` share their source, their target or both with a training pair."""
    train = corpus.splits["train"]
    sources, targets, both = {s for s, _ in train}, {t for _, t in train}, set(train)
    pairs = corpus.splits[split]
    return {
        "pairs": len(pairs),
        "source": sum(s in sources for s, _ in pairs),
        "target": sum(t in targets for _, t in pairs),
        "both": sum(p in both for p in pairs),
    }


def _long_input(sets: dict[str, list[Pair]], max_words: int) -> tuple[str, int]:
    """(set, index) of the longest source with at most `max_words` words (else the shortest longer one)."""

    def rank(item: tuple[str, int]) -> tuple[bool, int]:
        n = len(sets[item[0]][item[1]][0].split())
        return (n <= max_words, n if n <= max_words else -n)

    return max(((name, i) for name, pairs in sets.items() for i in range(len(pairs))), key=rank)


def make_record(info: RunInfo, corpus, split: str, settings: RecordSettings) -> dict:
    """Translate the split (and its windows) with the run's best checkpoint, once per beam size; the record
    as a dict."""
    import torch

    from nmt.checkpoint import load_checkpoint
    from nmt.corpora.windows import left_out, window_starts
    from nmt.evaluation import evaluate
    from nmt.provenance import provenance
    from nmt.study.attention_stats import attention_statistics
    from nmt.translator import Translator

    started = time.time()
    payload = load_checkpoint(info.path / "checkpoints" / "best.pt")
    greedy = Translator.from_payload(payload, settings.device, checkpoint=None)
    translators = {
        decoding_name({"beam_size": b}): Translator(greedy.model, greedy.tokenizer, settings.device, beam_size=b)
        for b in sorted(set(settings.beams))
    }
    names = window_sets(corpus, split) or [split]
    sets = {name: corpus.splits[name] for name in names}
    units = corpus.chapters.get(split)  # the resampling units (Bible chapters); None: each pair its own
    window_units = units or [0] * len(corpus.splits[split])  # what a window may not cross
    out_sets = {}
    for name, pairs in sets.items():
        references = [t for _, t in pairs]
        k = int(name.rsplit("_k", 1)[1]) if name != split else 1
        results = {dec: evaluate(t, pairs, [0], 0, None, name, progress=True) for dec, t in translators.items()}
        out_sets[name] = {
            "k": k,
            "sizes": [k] * len(window_starts(window_units, k)),
            "left_out": left_out(window_units, k),
            "references": references,
            "references_sha256": references_sha256(references),
            "source_words": [len(s.split()) for s, _ in pairs],
            "outputs": {
                dec: {"hypotheses": r["hypotheses"], "bleu": r["bleu"], "chrf": r["chrf"], "ter": r["ter"]}
                for dec, r in results.items()
            },
        }
    # how sharp the attention settled, teacher-forced on the study's own split (k=1): seeds compared by more than BLEU
    attention = attention_statistics(greedy.model, greedy.tokenizer, corpus.splits[split])
    long_set, index = _long_input(sets, settings.long_words)
    source, reference = sets[long_set][index]
    t = greedy.translate([source])[0][0]
    record = {
        "format": FORMAT,
        "version": VERSION,
        "name": info.path.name,
        "config": info.config,
        "provenance": info.provenance,
        "corpus": corpus.name,
        "split": split,
        "units": units,
        "overlap": overlap(corpus, split),
        "train_minutes": info.minutes,
        "trained_at": info.trained_at,
        "steps": info.step,
        "epochs": info.epoch,
        "finished": info.finished,
        "stopped_by": info.stopped_by,  # early_stopping: validation BLEU's plateau (trainer.patience) ended it
        "validations": validation_curve(info.history),
        "resumed_with_changes": info.resumed_with_changes,  # [] unless resumed with trainer.resume_changes=allow
        "best": info.best,
        "learning_curve": learning_curve(info.history),
        "parameters": greedy.model.num_parameters(),
        "attention_stats": attention,  # nmt.study.attention_stats; None for attention=none (absent: older records)
        "decodings": {
            dec: {k: v for k, v in tr.settings.items() if k != "attention"} for dec, tr in translators.items()
        },
        "signatures": next(iter(results.values()))["signatures"],
        "sets": out_sets,
        "long": {
            "set": long_set,
            "index": index,
            "source": source,
            "reference": reference,
            "text": t.text,
            "src_pieces": t.src_pieces,
            "tgt_pieces": t.tgt_pieces,
            "attention": [[round(float(x), 3) for x in row] for row in t.attention[: len(t.tgt_pieces)].tolist()]
            if greedy.has_alignment
            else None,
        },
    }
    record["recorded_by"] = {
        **provenance(torch.get_num_threads()),
        "seconds": round(time.time() - started, 1),
    }  # what made the record
    return record


def write_record(record: dict, path: Path) -> Path:
    """Gzip'd JSON, byte-for-byte the same for the same record (no timestamp in the gzip header)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(record, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode()
    with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as f:
        f.write(data)
    return path


REQUIRED = ("name", "config", "split", "sets", "long", "train_minutes", "steps", "best")
REQUIRED_BY_VERSION = {1: ("decoding",), 2: ("decodings",)}


def read_record(path: Path) -> dict:
    """A record written by write_record; a DataError naming the file and the fix on anything else."""
    try:
        record = json.loads(gzip.decompress(Path(path).read_bytes()))
    except OSError as e:
        raise DataError(
            f"{path}: cannot be read as a gzip'd record ({e}); pass a record written by nmt-study"
        ) from None
    except (ValueError, zlib.error, EOFError) as e:
        raise DataError(
            f"{path}: not a study record (broken gzip or JSON: {e}); write it again with nmt-study"
        ) from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise DataError(f"{path}: not a study record (no format {FORMAT!r}); pass a record written by nmt-study")
    if record.get("version", 0) > VERSION:
        raise DataError(
            f"{path}: record version {record['version']} is newer than this nmt reads ({VERSION}); update nmt"
        )
    missing = [k for k in (*REQUIRED, *REQUIRED_BY_VERSION.get(record.get("version", 1), ())) if k not in record]
    if missing:
        raise DataError(f"{path}: the record lacks {', '.join(missing)}; write it again with nmt-study")
    return record


@dataclass
class StudyRun:
    """One run as a study computes with it: its record and, per decoding and evaluated set, its outputs on
    the windows of exactly k pairs (exact_windows)."""

    record: dict
    outputs: dict[str, dict[str, Output]]  # decoding -> set -> Output

    @classmethod
    def of(cls, record: dict) -> StudyRun:
        outputs: dict[str, dict[str, Output]] = {}
        for name, s in record["sets"].items():
            keep, _ = exact_windows(s)
            refs, words = [s["references"][i] for i in keep], [s["source_words"][i] for i in keep]
            for dec, out in set_outputs(record, name).items():
                hyps = [out["hypotheses"][i] for i in keep]
                outputs.setdefault(dec, {})[name] = Output.of(hyps, refs, words)
        return cls(record, outputs)

    @property
    def name(self) -> str:
        return self.record["name"]

    @property
    def config(self) -> dict:
        return self.record["config"]

    @property
    def attention(self) -> str:
        return str(self.config.get("attention", {}).get("name"))

    @property
    def seed(self):
        return self.config.get("seed")

    @property
    def decodings(self) -> dict[str, dict]:
        return record_decodings(self.record)
