"""Example sentences for nmt-serve's page: from the test split of the checkpoint's corpus where that is cheap.

    examples = find_examples(payload, "run/checkpoints/best.pt")
    examples.sentences, examples.source      # ["...", ...], "test split of synthetic (data/cache/...)"

Where they come from, first found wins:
1. the corpus's data cache (`<paths.data_dir>/cache/<corpus>-<hash>/encoded.pt`, written by nmt-train), picked
   by its sentencepiece model being byte for byte the checkpoint's; the ids are decoded back to text. The
   data directory is looked up as stored, relative to the current directory, and relative to each folder
   above the checkpoint (nmt-train stores it relative to where it ran).
2. the synthetic task, regenerated from the stored config (a fraction of a second);
3. a small built-in list for the source language (Bible and Multi30k runs name it), said so on the page.
Nothing is downloaded and no corpus file is read.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from nmt.special import EOS_ID
from nmt.tokenizer import Tokenizer

log = logging.getLogger(__name__)

BUILT_IN = {
    "de": [
        "Im Anfang schuf Gott die Himmel und die Erde.",
        "Und Gott sprach: Es werde Licht! und es ward Licht.",
        "Ein Mann mit einem roten Hut sitzt auf einer Bank im Park.",
        "Zwei Kinder spielen am Strand mit einem großen Ball.",
    ],
    "fr": [
        "Au commencement, Dieu créa les cieux et la terre.",
        "Dieu dit: Que la lumière soit! Et la lumière fut.",
        "Un homme avec un chapeau rouge est assis sur un banc dans le parc.",
    ],
    "en": [
        "In the beginning God created the heaven and the earth.",
        "A man in a red hat is sitting on a bench in the park.",
    ],
    "es": ["En el principio creó Dios los cielos y la tierra.", "Y dijo Dios: Sea la luz: y fué la luz."],
}
LANGUAGE_NAMES = {"de": "German", "fr": "French", "en": "English", "es": "Spanish"}
BIBLE_LANGUAGES = {
    "k": "en",
    "4": "en",
    "3": "en",
    "e": "de",
    "s": "de",
    "l": "fr",
    "o": "fr",
    "5": "fr",
    "v": "es",
    "n": "ko",
    "r": "ru",
}
MAX_WORDS = 25  # longer test sentences make poor examples on a page


@dataclass
class Examples:
    sentences: list[str]
    source: str  # where they came from, shown on the page


def find_examples(payload: dict, checkpoint: str | Path, n: int = 4) -> Examples:
    """Up to `n` example source sentences for the checkpoint's corpus, of different lengths."""
    data, corpus, data_dir = _data_config(payload)
    try:
        found = corpus_test_sources(payload, checkpoint)
        if found:
            return Examples(spread(found[0], n), found[1])
    except Exception as e:  # examples are a convenience: never let them stop the server
        log.warning("example sentences: %s", e)
    lang = _source_language(data)
    if lang in BUILT_IN:
        return Examples(
            BUILT_IN[lang][:n],
            f"built-in {LANGUAGE_NAMES[lang]} sentences: the test split of "
            f"corpus {corpus} was not found in a data cache under {data_dir}",
        )
    return Examples(
        [],
        f"no examples: the test split of corpus {corpus} was not found in a data cache under "
        f"{data_dir}, and there is no built-in list for its source language",
    )


def corpus_test_sources(payload: dict, checkpoint: str | Path) -> tuple[list[str], str] | None:
    """Every source sentence of the test split of the checkpoint's corpus and where they came from, or None
    (steps 1 and 2 of the module docstring)."""
    data, corpus, data_dir = _data_config(payload)
    found = _from_cache(payload, corpus, data_dir, Path(checkpoint))
    if found is None and corpus == "synthetic":
        found = _from_synthetic(data)
    return found


def _data_config(payload: dict) -> tuple[dict, str, str]:
    config = payload.get("config") if isinstance(payload.get("config"), dict) else {}
    data = config.get("data") if isinstance(config.get("data"), dict) else {}
    return data, str(data.get("name", "?")), str((config.get("paths") or {}).get("data_dir", "data"))


def _candidate_dirs(data_dir: str, checkpoint: Path) -> list[Path]:
    path = Path(data_dir)
    if path.is_absolute():
        return [path]
    above = list(checkpoint.resolve().parents)[:5]
    seen, out = set(), []
    for d in [Path.cwd() / path] + [p / path for p in above]:
        if d.resolve() not in seen and (d / "cache").is_dir():
            seen.add(d.resolve())
            out.append(d)
    return out


def _from_cache(payload: dict, corpus: str, data_dir: str, checkpoint: Path) -> tuple[list[str], str] | None:
    spm_src = payload.get("spm_src")
    for d in _candidate_dirs(data_dir, checkpoint):
        for cache in sorted((d / "cache").glob(f"{corpus}-*")):
            model = cache / "spm.src.model"
            if not (model.is_file() and (cache / "encoded.pt").is_file()) or model.read_bytes() != spm_src:
                continue
            test = torch.load(cache / "encoded.pt", weights_only=True)["encoded"].get("test")
            if not test:
                continue
            tokenizer = Tokenizer(spm_src, payload["spm_tgt"])
            ids, lengths = test["src"].tolist(), test["src_lengths"].tolist()
            sentences, start = [], 0
            for length in lengths:
                seq = [i for i in ids[start : start + length] if i != EOS_ID]
                start += length
                sentences.append(tokenizer.src.decode(seq))
            return sentences, f"the test split of corpus {corpus} (data cache {_shown(cache)})"
    return None


def _shown(path: Path) -> str:
    """`path` relative to the current directory when it lies below it (shorter on the page)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _from_synthetic(data: dict) -> tuple[list[str], str]:
    from nmt.corpora import load_synthetic

    args = {k: v for k, v in data.items() if k not in ("name", "max_length")}
    test = [src for src, _ in load_synthetic(**args).splits["test"]]
    return test, "the test split of the synthetic task (regenerated from the checkpoint's config)"


def _source_language(data: dict) -> str | None:
    if data.get("name") == "bible":
        return BIBLE_LANGUAGES.get(str(data.get("source_translation", "e")))
    return data.get("src_lang") if isinstance(data.get("src_lang"), str) else None


def spread(sentences: list[str], n: int) -> list[str]:
    """`n` distinct sentences of at most MAX_WORDS words, from the shortest to the longest found."""
    pool = sorted({s for s in sentences if s.strip() and len(s.split()) <= MAX_WORDS}, key=lambda s: (len(s), s))
    if len(pool) <= n:
        return pool
    # evenly spaced over the lengths; the first picks are shortish, the last one of the longest
    return [pool[round(k * (len(pool) - 1) / (n - 1))] for k in range(n)] if n > 1 else pool[:1]
