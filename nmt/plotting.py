"""Figures: attention heatmaps (in the style of Bahdanau et al. 2015, Fig. 3) and BLEU-by-length curves.

    fig = attention_figure(weights, src_pieces, tgt_pieces)   # weights (T, S)
    save_figure(fig, "attention.png")

    fig = self_attention_figure(weights, src_pieces)          # weights (layers, heads, S, S): a grid of maps

nmt-study adds side-by-side heatmaps of one sentence under several models (attention_panels_figure),
BLEU against verse-window size (bleu_by_window_figure) and validation BLEU of the shortest and longest
length buckets over training time (learning_curves_figure).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display needed
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402


def attention_figure(
    weights, src_pieces: Sequence[str], tgt_pieces: Sequence[str], title: str = "", has_alignment: bool = True
) -> Figure:
    """Source pieces along the top, target pieces down the side, brighter = more weight.

    `weights` is (T, S) with T = len(tgt_pieces) and S = len(src_pieces). The figure grows with the
    sentence so long sentences stay readable. Without alignment (`attention=none`) it says so.
    """
    S, T = len(src_pieces), len(tgt_pieces)
    width, height = min(4 + 0.28 * S, 40), min(2.5 + 0.28 * T, 40)
    fig, ax = plt.subplots(figsize=(width, height), dpi=100)
    if not has_alignment:
        ax.axis("off")
        ax.text(
            0.5,
            0.5,
            "attention=none: the decoder reads one fixed sentence vector,\nso there is no alignment to show",
            ha="center",
            va="center",
            fontsize=12,
        )
        if title:
            ax.set_title(title)
        return fig
    w = weights.detach().float().cpu().numpy() if hasattr(weights, "detach") else weights
    ax.imshow(w[:T, :S], cmap="gray", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
    ax.set_xticks(range(S))
    ax.set_xticklabels(src_pieces, rotation=90, fontsize=9)
    ax.xaxis.tick_top()
    ax.set_yticks(range(T))
    ax.set_yticklabels(tgt_pieces, fontsize=9)
    ax.set_xlabel("source")
    ax.set_ylabel("output")
    if title:
        ax.set_title(title, pad=12 + 5 * max((len(p) for p in src_pieces), default=1), fontsize=10)
    fig.tight_layout()
    return fig


def self_attention_figure(weights, src_pieces: Sequence[str], title: str = "") -> Figure:
    """The encoder's self-attention (model.self_attention_layers): one source x source map per layer (rows) and
    head (columns); each map's row is a source position asking (query), its columns the positions it reads.

    `weights` is (layers, heads, S, S) with S = len(src_pieces). Self-attention often spreads its weight, so
    black is 0 and white the largest weight in the figure (its colour bar says which), not 1.
    """
    w = weights.detach().float().cpu().numpy() if hasattr(weights, "detach") else weights
    layers, heads, S = w.shape[0], w.shape[1], len(src_pieces)
    top = max(float(w[:, :, :S, :S].max()), 1e-6)
    side = min(1.6 + 0.2 * S, 12)
    fig, axes = plt.subplots(
        layers, heads, figsize=(side * heads + 1.5, side * layers + 1.2), dpi=100, squeeze=False, layout="constrained"
    )
    for layer in range(layers):
        for head in range(heads):
            ax = axes[layer][head]
            image = ax.imshow(
                w[layer, head, :S, :S], cmap="gray", vmin=0.0, vmax=top, aspect="equal", interpolation="nearest"
            )
            ax.set_xticks(range(S))
            ax.set_xticklabels(src_pieces, rotation=90, fontsize=7)
            ax.xaxis.tick_top()
            ax.set_yticks(range(S))
            ax.set_yticklabels(src_pieces, fontsize=7)
            ax.set_xlabel(f"layer {layer + 1}, head {head + 1}", fontsize=9)
    fig.colorbar(image, ax=axes, shrink=0.6, label="weight")
    caption = "self-attention: row = query position, column = position read"
    fig.suptitle(f"{title}\n{caption}" if title else caption, fontsize=9)
    return fig


def bleu_by_length_figure(series: dict[str, list[dict]], title: str = "BLEU by source length") -> Figure:
    """One line per series, with its interval as a band. Each row: {"bucket", "bleu", optional
    "low"/"high" (interval), "n"}."""
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    # one x position per bucket over all series, so series with different empty buckets stay aligned
    labels: dict[str, str] = {}
    for rows in series.values():
        for r in rows:
            labels.setdefault(r["bucket"], f"{r['bucket']}\n(n={r['n']})")
    position = {bucket: i for i, bucket in enumerate(labels)}
    for name, rows in series.items():
        rows = [r for r in rows if r.get("bleu") is not None]
        if not rows:
            continue
        _line_with_band(ax, name, [position[r["bucket"]] for r in rows], rows)
    return _finish_bleu_axes(
        fig, ax, list(range(len(labels))), list(labels.values()), "source sentence length (words)", title
    )


def bleu_by_window_figure(
    series: dict[str, list[dict]],
    title: str = "BLEU by window size",
    xlabel: str = "verses per input (window size k)",
    trained_k: int | None = None,
) -> Figure:
    """BLEU against the window size k, one line (and its interval band) per series.

    Each row: {"k", "bleu", "low"/"high" (interval, may be None), "source_words" (mean per window), optional
    "seed_bleu" (each seed's BLEU, drawn as dots)}. The x ticks say k and the mean source words of the first
    series' windows; with `trained_k`, a dashed line marks where the k never seen in training begin.
    """
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    ticks: dict[int, str] = {}
    for name, rows in series.items():
        rows = [r for r in rows if r.get("bleu") is not None]
        for r in rows:
            ticks.setdefault(r["k"], f"k={r['k']}\n({r.get('source_words', 0):.0f} words)")
        if not rows:
            continue
        line = _line_with_band(ax, name, [r["k"] for r in rows], rows)
        for r in rows:
            seeds = [b for b in r.get("seed_bleu") or [] if b is not None]
            if len(seeds) > 1:
                ax.scatter([r["k"]] * len(seeds), seeds, s=9, color=line.get_color(), alpha=0.6, zorder=3)
    if trained_k is not None and ticks and max(ticks) > trained_k:
        ax.axvline(trained_k + 0.5, color="grey", linestyle="--", linewidth=1)
        ax.text(
            trained_k + 0.55,
            0.02,
            "longer than\nany training input",
            fontsize=7,
            color="grey",
            transform=ax.get_xaxis_transform(),
        )
    return _finish_bleu_axes(fig, ax, sorted(ticks), [ticks[k] for k in sorted(ticks)], xlabel, title)


def _line_with_band(ax, name: str, x: list, rows: list[dict]):
    """BLEU of `rows` at `x`, and the rows' interval ("low"/"high") as a band of the line's colour; the line."""
    line = ax.plot(x, [r["bleu"] for r in rows], marker="o", label=name)[0]
    if all(r.get("low") is not None and r.get("high") is not None for r in rows):
        ax.fill_between(x, [r["low"] for r in rows], [r["high"] for r in rows], alpha=0.2, color=line.get_color())
    return line


def _finish_bleu_axes(fig: Figure, ax, ticks: list, labels: list[str], xlabel: str, title: str) -> Figure:
    ax.set_xticks(ticks)
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("BLEU")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


NO_ALIGNMENT = "attention=none:\nthe decoder reads one fixed\nsentence vector, so there is\nno alignment to show"


def attention_panels_figure(
    panels: Sequence[tuple[str, object, Sequence[str], Sequence[str], bool]], title: str = ""
) -> Figure:
    """One heatmap per (label, weights (T, S), src_pieces, tgt_pieces, has_alignment), side by side.

    A panel without alignment (`attention=none`) says so instead of showing an all-black square.
    """
    widths = [min(1.5 + 0.11 * len(src), 14) if aligned else 3.0 for _, _, src, _, aligned in panels]
    height = min(2.5 + 0.11 * max((len(tgt) for _, _, _, tgt, _ in panels), default=1), 14)
    fig, axes = plt.subplots(
        1, len(panels), figsize=(sum(widths), height), dpi=100, squeeze=False, gridspec_kw={"width_ratios": widths}
    )
    for ax, (label, weights, src, tgt, aligned) in zip(axes[0], panels, strict=True):
        ax.set_xlabel(label, fontsize=11)
        if not aligned:
            ax.set_xticks([])
            ax.set_yticks([])
            ax.text(0.5, 0.5, NO_ALIGNMENT, ha="center", va="center", fontsize=10, transform=ax.transAxes)
            continue
        w = weights.detach().float().cpu().numpy() if hasattr(weights, "detach") else weights
        ax.imshow(w[: len(tgt), : len(src)], cmap="gray", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
        ax.set_xticks(range(len(src)))
        ax.set_xticklabels(src, rotation=90, fontsize=6)
        ax.xaxis.tick_top()
        ax.set_yticks(range(len(tgt)))
        ax.set_yticklabels(tgt, fontsize=6)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def learning_curves_figure(curves: dict[str, list[dict]]) -> Figure:
    """Validation BLEU over training time, shortest bucket left, longest right; one colour per name.

    `curves` maps a name to one curve per run (seed): {"shortest"|"longest": {"bucket", "n", "points"}}
    with points [[minutes, BLEU, step], ...].
    """
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), dpi=100, sharey=True)
    for side, ax in zip(("shortest", "longest"), axes, strict=True):
        buckets = set()
        for i, (name, runs) in enumerate(curves.items()):
            for j, curve in enumerate(c for c in runs if side in c):
                points = curve[side]["points"]
                buckets.add(f"{curve[side]['bucket']} words, n={curve[side]['n']}")
                ax.plot(
                    [p[0] for p in points],
                    [p[1] for p in points],
                    color=f"C{i}",
                    marker="o",
                    markersize=3,
                    alpha=0.85,
                    label=name if j == 0 else None,
                )
        ax.set_title(f"{side} validation bucket ({'; '.join(sorted(buckets))})", fontsize=10)
        ax.set_xlabel("training time (minutes)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("validation BLEU")
    axes[0].set_ylim(bottom=0)
    axes[1].legend()
    fig.tight_layout()
    return fig


def close_figure(fig: Figure) -> None:
    plt.close(fig)


def save_figure(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
