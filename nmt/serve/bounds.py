"""The size bound of nmt-serve's page: a heatmap past its share of cells is drawn coarser (nmt/serve/page.py).

    grid = fit(weights, cols, rows, max_cells=MAP_CELLS)   # weights (R, C) nested lists, each row summing to 1
    grid.weights, grid.cols, grid.rows, grid.group        # group 1: as given; g > 1: a cell is g x g pieces

The page draws every map as SVG, about 200 bytes a cell, and a checkpoint with self-attention in its encoder has
a map per layer and head: at 100 source pieces, 2 layers and 8 heads that is 160,000 cells, a page of some
30 MB. So a cross-attention map may have MAP_CELLS cells, and a checkpoint's self-attention maps SELF_ATTENTION_CELLS
together (each map an equal share); a map past its bound is drawn downsampled: consecutive pieces are taken in
groups of g (the smallest g that fits, the last group maybe shorter), each cell is a block of up to g rows by g
columns, and its weight is the mean over its rows of the sum over its columns, so every row still sums to 1. A
group's label names its first and last piece ("▁bimi…▁raka"). The page says how coarse a map is drawn and that the
JSON API (POST /translate) gives every weight. A page is then at most a few MB however long the sentence.
"""

from __future__ import annotations

from dataclasses import dataclass

from nmt.serve.models import WEIGHT_DIGITS

MAP_CELLS = 4096  # a cross-attention map: 64 x 64 pieces at full resolution
SELF_ATTENTION_CELLS = 8192  # a checkpoint's self-attention maps together (2 layers x 2 heads: 45 x 45 pieces each)


@dataclass(frozen=True)
class Grid:
    """A map as drawn: weights (rows x cols), the labels of its rows and columns, and the pieces a cell spans."""

    weights: list[list[float]]
    cols: list[str]
    rows: list[str]
    group: int  # 1: a cell per piece; g: a cell per g x g pieces


def group_size(n_rows: int, n_cols: int, max_cells: int) -> int:
    """The smallest g such that groups of g pieces give at most `max_cells` cells (at least 1 cell)."""
    g = 1
    while -(-n_rows // g) * -(-n_cols // g) > max(1, max_cells):
        g += 1
    return g


def group_label(pieces: list[str]) -> str:
    return pieces[0] if len(pieces) == 1 else f"{pieces[0]}…{pieces[-1]}"


def fit(weights: list[list[float]], cols: list[str], rows: list[str], max_cells: int) -> Grid:
    """The map of `weights` (len(rows) x len(cols)) within `max_cells` cells: as given, or downsampled (above)."""
    g = group_size(len(rows), len(cols), max_cells)
    if g == 1:
        return Grid(weights, cols, rows, 1)
    row_starts, col_starts = range(0, len(rows), g), range(0, len(cols), g)
    out = []
    for r0 in row_starts:
        block = weights[r0 : r0 + g]
        sums = [sum(sum(row[c0 : c0 + g]) for row in block) for c0 in col_starts]
        out.append([round(s / len(block), WEIGHT_DIGITS) for s in sums])
    return Grid(
        out,
        [group_label(cols[c0 : c0 + g]) for c0 in col_starts],
        [group_label(rows[r0 : r0 + g]) for r0 in row_starts],
        g,
    )


def coarseness(group: int, what: str) -> str:
    """The page's note under a map drawn coarser: what a cell spans and where to get every weight."""
    return (
        f"{what} drawn coarser to keep the page small: a cell spans up to {group} x {group} pieces (its weight: "
        "the mean over its rows of their weight on its columns). POST /translate gives every weight."
    )
