"""Figures: attention heatmaps (in the style of Bahdanau et al. 2015, Fig. 3) and BLEU-by-length curves.

    fig = attention_figure(weights, src_pieces, tgt_pieces)   # weights (T, S)
    save_figure(fig, "attention.png")
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display needed
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402


def attention_figure(weights, src_pieces: Sequence[str], tgt_pieces: Sequence[str], title: str = "",
                     has_alignment: bool = True) -> Figure:
    """Source pieces along the top, target pieces down the side, brighter = more weight.

    `weights` is (T, S) with T = len(tgt_pieces) and S = len(src_pieces). The figure grows with the
    sentence so long sentences stay readable. Without alignment (`attention=none`) it says so.
    """
    S, T = len(src_pieces), len(tgt_pieces)
    width, height = min(4 + 0.28 * S, 40), min(2.5 + 0.28 * T, 40)
    fig, ax = plt.subplots(figsize=(width, height), dpi=100)
    if not has_alignment:
        ax.axis("off")
        ax.text(0.5, 0.5, "attention=none: the decoder reads one fixed sentence vector,\n"
                "so there is no alignment to show", ha="center", va="center", fontsize=12)
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


def bleu_by_length_figure(series: dict[str, list[dict]], title: str = "BLEU by source length") -> Figure:
    """One line per series. Each row: {"bucket", "bleu", optional "low"/"high" (interval), "n"}."""
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    for name, rows in series.items():
        rows = [r for r in rows if r.get("bleu") is not None]
        if not rows:
            continue
        x = list(range(len(rows)))
        ax.plot(x, [r["bleu"] for r in rows], marker="o", label=name)
        if all("low" in r and "high" in r for r in rows):
            ax.fill_between(x, [r["low"] for r in rows], [r["high"] for r in rows], alpha=0.2)
        ax.set_xticks(x)
        ax.set_xticklabels([f"{r['bucket']}\n(n={r['n']})" for r in rows], fontsize=8)
    ax.set_xlabel("source sentence length (words)")
    ax.set_ylabel("BLEU")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(title)
    fig.tight_layout()
    return fig


def save_figure(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
