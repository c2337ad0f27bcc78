"""Scoring a translator on a list of (source, reference) pairs, and the files that record it.

    result = evaluate(translator, pairs, edges=[0, 10, 20], heatmaps=4, out_dir=Path("eval"), split="test")
    print(format_report(result))

`result` holds corpus BLEU, chrF and TER with their sacrebleu signatures, BLEU/chrF by source length
(whitespace words), the decoding settings, the checkpoint path and the hypotheses. With an `out_dir`,
it writes <split>.json (everything but the hypotheses), <split>.hyp (one line per input), <split>.md,
<split>_bleu_by_length.png and attention/<split>_<n>.png heatmaps (n = 1-based sentence number; with
self-attention in the encoder, attention/<split>_<n>-self.png beside each).
No CLI concerns here: nmt-evaluate and nmt-study both call `evaluate`.

A translator is anything with `translate(texts) -> list[list[Translation]]` and the attributes
`settings` (dict), `checkpoint` (str | None) and `has_alignment` (bool), as nmt.translator.Translator; where it
also has `self_attention(text)` ((layers, heads, S, S) or None), the encoder's self-attention is drawn too.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from tqdm import tqdm

from nmt.atomic import atomic_path
from nmt.errors import DataError, OutputError, write_failure
from nmt.metrics import DEFAULT_EDGES, bleu_by_length, corpus_scores, format_number

METRICS = (("BLEU", "bleu"), ("chrF", "chrf"), ("TER", "ter"))  # (label, result key)


def evaluate(
    translator,
    pairs: Sequence[tuple[str, str]],
    edges: Sequence[int] = DEFAULT_EDGES,
    heatmaps: int = 4,
    out_dir: Path | None = None,
    split: str = "test",
    meta: dict | None = None,
    progress: bool = False,
) -> dict:
    """Translate the sources of `pairs`, score against their references, and write files to `out_dir`.

    `meta` (plain values, e.g. the corpus name) is copied into the result and the JSON file. A score is of
    whole inputs: the translator's cap on source pieces (a guard for free text, 250 by default, which
    windows of several Bible verses pass) is raised to the longest source here, so no input is cut. With
    `progress`, a bar on stderr counts the sentences translated (the translator's translate then takes a
    `progress` callable, as nmt.translator.Translator's does).
    """
    if not pairs:
        raise DataError(f"split {split!r} has no sentence pairs to evaluate on")
    sources = [s for s, _ in pairs]
    translator.fit_to(sources)
    references = [t for _, t in pairs]
    with tqdm(
        total=len(sources), desc=f"translating {split}", unit="sentence", disable=not progress, leave=False
    ) as bar:
        done = translator.translate(sources, progress=bar.update) if progress else translator.translate(sources)
    best = [nbest[0] for nbest in done]
    hypotheses = [t.text for t in best]
    scores = corpus_scores(hypotheses, references)
    result = {
        "split": split,
        "sentences": len(pairs),
        "checkpoint": translator.checkpoint,
        **(meta or {}),
        "decoding": dict(translator.settings),
        "bleu": scores["bleu"],
        "chrf": scores["chrf"],
        "ter": scores["ter"],
        "signatures": scores["signatures"],
        "by_length": bleu_by_length(sources, hypotheses, references, list(edges)),
        "heatmaps": [],
        "files": {},
    }
    if out_dir is not None:
        try:
            write_outputs(result, Path(out_dir), sources, hypotheses, best, heatmaps, translator)
        except OutputError as e:
            e.result = result  # the scores are printed all the same
            raise
    result["hypotheses"] = hypotheses
    return result


ELSEWHERE = "choose another folder with output=..."


def check_writable(out_dir: Path) -> None:
    """An OutputError naming `out_dir` and the fix where no file can be written there (read-only, no permission, a
    full disk): checked before decoding, which may take long."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with atomic_path(out_dir / ".nmt-evaluate-check") as tmp:
            tmp.write_bytes(b"x" * 4096)  # a few KiB, as the smallest output: an empty file fits on a full disk
        (out_dir / ".nmt-evaluate-check").unlink()
    except OSError as e:
        reason, fix = write_failure(e, ELSEWHERE)
        raise OutputError(f"{out_dir}: cannot write the evaluation's files there: {reason}; {fix}") from None


@contextmanager
def _writing(path: Path) -> Iterator[Path]:
    """A temporary path to write output `path` through (nmt.atomic: the file is whole or absent); a failure is
    an OutputError naming `path` and the fix."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            yield tmp
    except OSError as e:
        reason, fix = write_failure(e, ELSEWHERE)
        raise OutputError(f"{path}: could not write it: {reason}; {fix}") from None


def heatmap_picks(lengths: Sequence[int], k: int) -> list[int]:
    """k indices spread evenly over the non-zero `lengths` sorted by (length, index), the longest included."""
    ranked = sorted((n, i) for i, n in enumerate(lengths) if n > 0)
    if k <= 0 or not ranked:
        return []
    positions = [round((j + 1) / k * (len(ranked) - 1)) for j in range(k)]
    return sorted({ranked[p][1] for p in positions})


def write_outputs(
    result: dict,
    out_dir: Path,
    sources: list[str],
    hypotheses: list[str],
    best: list,
    heatmaps: int,
    translator,
) -> None:
    """Write the .hyp, heatmaps (and, with model.self_attention_layers > 0, the encoder's self-attention maps
    beside them: attention/<split>_<n>-self.png), BLEU-by-length figure, .md and .json files (and fill
    result["files"])."""
    from nmt.plotting import attention_figure, bleu_by_length_figure, self_attention_figure

    split = result["split"]
    out_dir.mkdir(parents=True, exist_ok=True)
    files = result["files"]
    hyp_path = out_dir / f"{split}.hyp"
    with _writing(hyp_path) as tmp:
        tmp.write_text("".join(h.replace("\n", " ") + "\n" for h in hypotheses), encoding="utf-8")
    files["hyp"] = str(hyp_path)

    for i in heatmap_picks([len(t.src_pieces) for t in best], heatmaps):
        t = best[i]
        title = f"{split} #{i + 1}: {sources[i][:80]}"
        fig = attention_figure(t.attention, t.src_pieces, t.tgt_pieces, title, has_alignment=translator.has_alignment)
        path = _save(fig, out_dir / "attention" / f"{split}_{i + 1}.png")
        entry = {"sentence": i + 1, "source_pieces": len(t.src_pieces), "file": str(path)}
        self_attention = getattr(translator, "self_attention", None)
        weights = self_attention(sources[i]) if self_attention else None  # (layers, heads, S, S); None without
        if weights is not None:
            fig = self_attention_figure(weights, t.src_pieces, title)
            entry["self_attention_file"] = str(_save(fig, out_dir / "attention" / f"{split}_{i + 1}-self.png"))
        result["heatmaps"].append(entry)

    rows = result["by_length"]
    fig = bleu_by_length_figure({split: rows}, title=f"BLEU by source length ({split})")
    files["bleu_by_length"] = str(_save(fig, out_dir / f"{split}_bleu_by_length.png"))

    md_path = out_dir / f"{split}.md"
    with _writing(md_path) as tmp:
        tmp.write_text(markdown_report(result), encoding="utf-8")
    files["md"] = str(md_path)
    json_path = out_dir / f"{split}.json"
    files["json"] = str(json_path)
    with _writing(json_path) as tmp:
        tmp.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _save(fig, path: Path) -> Path:
    """Figure `fig` as PNG file `path` (whole or absent; a failure is an OutputError), then closed."""
    from nmt.plotting import close_figure

    try:
        with _writing(path) as tmp:
            fig.savefig(tmp, format="png")
    finally:
        close_figure(fig)
    return path


def _decoding_line(result: dict) -> str:
    d = result.get("decoding", {})
    kind = "greedy" if d.get("beam_size", 1) == 1 else f"beam {d.get('beam_size')}"
    why = f" ({d['precision_reason']})" if d.get("precision_reason") else ""  # older reports lack it
    kernels = f", {d['kernels_resolved']} kernels" if d.get("kernels_resolved") else ""  # since decoding.kernels
    return (
        f"{kind}, length penalty {d.get('length_penalty')}, max length {d.get('max_len_ratio')} x source + "
        f"{d.get('max_len_extra')}, {d.get('precision', 'fp32')}{why}{kernels}"
    )


def markdown_report(result: dict) -> str:
    """The scores, signatures and by-length table as Markdown."""
    sig = result["signatures"]
    lines = [
        f"# {result['split']}: {result['sentences']} sentences",
        "",
        f"checkpoint: `{result.get('checkpoint')}`  ",
        f"decoding: {_decoding_line(result)}",
        "",
        "| metric | score | signature |",
        "|---|---:|---|",
    ]
    lines += [f"| {name} | {format_number(result[key])} | `{sig[key]}` |" for name, key in METRICS]
    lines += ["", "| source words | sentences | BLEU | chrF |", "|---|---:|---:|---:|"]
    lines += [
        f"| {r['bucket']} | {r['n']} | {format_number(r['bleu'])} | {format_number(r['chrf'])} |"
        for r in result["by_length"]
    ]
    return "\n".join(lines) + "\n"


def format_report(result: dict) -> str:
    """Scores with signatures and the BLEU-by-length table as aligned plain text."""
    lines = [f"{result['split']}: {result['sentences']} sentences, {_decoding_line(result)}"]
    if result.get("checkpoint"):
        lines.append(f"checkpoint: {result['checkpoint']}")
    lines += [f"{name:<5} {format_number(result[key]):>6}   {result['signatures'][key]}" for name, key in METRICS]
    lines += ["", f"{'source words':<14} {'n':>6} {'BLEU':>7} {'chrF':>7}"]
    lines += [
        f"{r['bucket']:<14} {r['n']:>6} {format_number(r['bleu']):>7} {format_number(r['chrf']):>7}"
        for r in result["by_length"]
    ]
    if result.get("files"):
        lines += ["", f"written to {Path(result['files']['json']).parent}"]
    return "\n".join(lines)
