"""The figures of docs/serving.md, written from the committed JSON files under docs/ (scripts/readme_tables.py
puts each block between its markers; tests/test_serving_doc.py checks them):

- flood_block: `scripts/serve_flood.py`'s held connections, slow readers and burst, one column per run (FLOOD_RUNS):
  the code before the send deadline, with it, and the same phases of the two runs of every phase (with the page
  and chunk bounds; with the short lanes and turns as well);
- pages_block: its page readers, chunkers and reconnecting never-readers, before the page and chunk bounds, with
  them, and with the short lanes and turns as well, on the busy machine and with its trainings paused (PAGE_RUNS);
- latency_block: `scripts/serve_latency.py`'s start-up and latency (serve_latency.json).

Each block first names its files with the command that wrote each, the CPU, the load average before the run and
the date. A file that records no command is given the one its checkpoints and phases say
(`python scripts/serve_flood.py CKPT ... [--phases ...] --out FILE`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from perf_tables import load, rel  # noqa: E402  (a JSON file; a path as the docs name it)
from serve_flood import FLOORS, PHASES  # noqa: E402  (scripts/serve_flood.py: its targets and phases)

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# (column heading, file): the runs each table sets side by side
FLOOD_RUNS = (
    ("before the send deadline", DOCS / "serve_flood_before_send_deadline.json"),
    ("with the send deadline", DOCS / "serve_flood_send_deadline.json"),
    ("with the page and chunk bounds too", DOCS / "serve_flood_before_lanes.json"),
    ("with the short lanes and turns too", DOCS / "serve_flood.json"),
)
PAGE_RUNS = (
    ("before the page and chunk bounds", DOCS / "serve_flood_before_page_bounds.json"),
    ("with them", DOCS / "serve_flood_before_lanes.json"),
    ("with the short lanes and turns too", DOCS / "serve_flood.json"),
    ("the same, the machine's two trainings paused", DOCS / "serve_flood_trainings_paused.json"),
)
LATENCY = DOCS / "serve_latency.json"
# the key of each phase in a serve_flood.py report
PHASE_KEYS = {
    "held": "held_connections",
    "readers": "slow_reader_attack",
    "burst": "burst",
    "pages": "page_and_chunk_attack",
    "reconnect": "reconnecting_never_readers",
}
# a burst's outcomes, as nmt-serve words them, shortened for a cell
OUTCOMES = (
    ("200 OK", "answered 200"),
    ("requests are in progress", "answered 503 past `--max-active`"),
    ("being translated", "answered 503 (too many being translated)"),
    ("too many connections", "answered 503 past `--max-connections`"),
)


def command(report: dict, path: Path, script: str = "serve_flood.py") -> str:
    """The command that wrote `report`: its own record, else the one its checkpoints and phases say."""
    if report.get("command"):
        return report["command"]
    words = ["python", f"scripts/{script}", *report["checkpoints"]]
    phases = [p for p in PHASES if PHASE_KEYS[p] in report]
    if script == "serve_flood.py" and phases != list(PHASES):
        words += ["--phases", ",".join(phases)]
    words += ["--out", rel(path)]
    if report.get("server_args"):
        words += ["--", *report["server_args"]]
    return " ".join(words)


def sources(runs: tuple[tuple[str, Path], ...], script: str = "serve_flood.py") -> list[str]:
    """One line per run: its heading, file, command, CPU, load average before it and date."""
    lines = []
    for heading, path in runs:
        report = load(path)
        lines.append(
            f"- {heading} ([{path.name}]({path.name})): `{command(report, path, script)}`; {report['cpu']}; load "
            f"average {report['load_average_1min_before']:.1f} before the run; {report['measured'][:10]}"
        )
    return lines


def ms(value: float) -> str:
    if value < 100:
        return f"{value:.1f} ms"
    return f"{value:.0f} ms" if value < 1000 else f"{value / 1000:.1f} s"


def statuses(counts: dict[str, int]) -> str:
    """'186 answered 503, 7 answered 200, 1 TimeoutError': most first; a bare HTTP status is one answered."""
    said = {f"answered {k}" if k.isdigit() else k: n for k, n in counts.items()}
    return ", ".join(f"{n:,} {status}" for status, n in sorted(said.items(), key=lambda kv: -kv[1]))


def asked(r: dict) -> str:
    """A normal client's requests: how many answered 200 within 1 s, their statuses, median and slowest."""
    total, fast = r["requests"], r["answered_200_within_1s"]
    said = f" ({statuses(r['statuses'])})" if fast < total else ""
    return (
        f"{fast:,} of {total:,} answered 200 within 1 s{said}; median {ms(r['median_ms'])}, slowest {ms(r['max_ms'])}"
    )


def under_attack(attack: str) -> Callable[[dict], str | None]:
    """The normal client's requests during an attack, and whether the target was met."""

    def cell(report: dict) -> str | None:
        if attack not in report:
            return None
        r = report[attack]["requests_during"]
        met = r["answered_200_within_1s"] >= FLOORS[attack] * r["requests"]
        return f"{asked(r)}: target {'met' if met else 'not met'}"

    return cell


def requests(key: str) -> Callable[[dict], str | None]:
    return lambda report: asked(report[key]) if key in report else None


def held(kind: str) -> Callable[[dict], str | None]:
    """How the server closed the held connections of one kind: what it said, and when after they opened."""

    def cell(report: dict) -> str | None:
        if "held_connections" not in report:
            return None
        h = report["held_connections"][kind]
        said = {k.strip("()").replace("HTTP/1.1 ", "answered "): n for k, n in h["replies"].items()}
        after, left = h["closed_after_s"], h["connections"] - h["closed"]
        return f"{statuses(said)}, {after['min']:.2f}-{after['max']:.2f} s after opening" + (
            f"; {left:,} left open" if left else ""
        )

    return cell


def readers(kind: str) -> Callable[[dict], str | None]:
    """How many of the slow or never-reading attackers the server cut, and when after they opened."""

    def cell(report: dict) -> str | None:
        if "slow_reader_attack" not in report:
            return None
        a = report["slow_reader_attack"]["attackers"][kind]
        cut = a["cut_after_s"]
        text = (
            f"{a['cut_by_the_server']} of {a['connections']} cut, {cut['min']:.1f}-{cut['max']:.1f} s after opening"
            if a["cut_by_the_server"]
            else f"none of {a['connections']} cut in {a['held_s']:.0f} s"
        )
        return text + (f"; read {a['read_kb_per_s_median']:.1f} KB/s" if "read_kb_per_s_median" in a else "")

    return cell


def burst(report: dict) -> str | None:
    if "burst" not in report:
        return None
    outcomes: dict[str, int] = {}
    for said, n in report["burst"]["outcomes"].items():
        short = next((name for part, name in OUTCOMES if part in said), said)
        outcomes[short] = outcomes.get(short, 0) + n
    return f"{sum(outcomes.values()):,} requests in {report['burst']['seconds']:.1f} s: {statuses(outcomes)}"


def memory(*phases: str) -> Callable[[dict], str | None]:
    def cell(report: dict) -> str | None:
        rss = report["server_rss_mib"]
        return " / ".join(f"{rss[p]:.0f}" if rss.get(p) is not None else "-" for p in phases)

    return cell


def page(report: dict) -> str | None:
    if "page_and_chunk_attack" not in report:
        return None
    p = report["page_and_chunk_attack"]["page"]
    coarser = f', {p["notes_drawn_coarser"]} notes "drawn coarser"' if p["notes_drawn_coarser"] else ""
    return f"{p['bytes'] / 1e6:.1f} MB, {p['cells']:,} cells{coarser}, {p['seconds']:.1f} s"


def chunkers(report: dict) -> str | None:
    if "page_and_chunk_attack" not in report:
        return None
    answers = report["page_and_chunk_attack"]["attackers"]["chunkers"]["answers"]
    return statuses({k.replace("HTTP/1.1 ", "answered "): n for k, n in answers.items()})


def reopened(report: dict) -> str | None:
    if "reconnecting_never_readers" not in report:
        return None
    return f"{report['reconnecting_never_readers']['attackers']['closed by the server and reopened']:,}"


def table(runs: tuple[tuple[str, Path], ...], rows: list[tuple[Callable[[dict], str], Callable]]) -> list[str]:
    """A markdown table: one row per (label, cell), one column per run; a row's label is that of the first run
    with its phase, and a run without the phase shows '-'."""
    reports = [load(path) for _, path in runs]
    lines = ["| what | " + " | ".join(h for h, _ in runs) + " |", "|---|" + "---|" * len(runs)]
    for label, cell in rows:
        cells = [cell(r) for r in reports]
        first = next((r for r, c in zip(reports, cells, strict=True) if c is not None), None)
        if first is not None:
            lines.append(f"| {label(first)} | " + " | ".join(c if c is not None else "-" for c in cells) + " |")
    return lines


def dig(report: dict, *path: str):
    """report[path[0]][path[1]]...: a figure the row's label names."""
    for key in path:
        report = report[key]
    return report


def _held_total(r: dict) -> int:
    return sum(h["connections"] for h in r["held_connections"].values())


def _readers(r: dict) -> int:
    return sum(a["connections"] for a in r["slow_reader_attack"]["attackers"].values())


FLOOD_ROWS = [
    (lambda r: "POST /translate, one after another, before any attack", requests("requests_before")),
    (lambda r: f"POST /translate while {_held_total(r):,} connections are held open", requests("requests_during")),
    (lambda r: f"the {dig(r, 'held_connections', 'idle', 'connections'):,} that send nothing", held("idle")),
    (lambda r: f"the {dig(r, 'held_connections', 'half', 'connections'):,} that send half their headers", held("half")),
    (lambda r: f"the {dig(r, 'held_connections', 'slow', 'connections'):,} that send one byte of a body", held("slow")),
    (lambda r: "POST /translate after them", requests("requests_after")),
    (
        lambda r: (
            f"POST /translate under {_readers(r)} slow readers and never-readers (target: "
            f"{FLOORS['slow_reader_attack']:.0%} answered 200 within 1 s)"
        ),
        under_attack("slow_reader_attack"),
    ),
    (lambda r: "the slow readers", readers("slow")),
    (lambda r: "the never-readers", readers("never")),
    (lambda r: f"a burst of {r['burst']['clients']} clients x {r['burst']['requests_each']} requests", burst),
    (lambda r: "POST /translate after the burst", requests("requests_after_the_burst")),
    (
        lambda r: "the server's resident memory, MiB: before / with the held connections / under the slow readers",
        memory("before", "held connections", "slow readers"),
    ),
]
PAGE_ROWS = [
    (lambda r: "POST /translate, one after another, before any attack", requests("requests_before")),
    (
        lambda r: (
            f"one {dig(r, 'page_and_chunk_attack', 'attackers', 'page_readers', 'words')}-word page, read whole, alone"
        ),
        page,
    ),
    (
        lambda r: (
            f"POST /translate under {dig(r, 'page_and_chunk_attack', 'attackers', 'page_readers', 'clients')} "
            f"page readers and {dig(r, 'page_and_chunk_attack', 'attackers', 'chunkers', 'clients')} chunkers "
            f"(target: {FLOORS['page_and_chunk_attack']:.0%} answered 200 within 1 s)"
        ),
        under_attack("page_and_chunk_attack"),
    ),
    (
        lambda r: (
            f"the chunkers' {dig(r, 'page_and_chunk_attack', 'attackers', 'chunkers', 'body_bytes'):,}-byte bodies"
        ),
        chunkers,
    ),
    (lambda r: "POST /translate after them", requests("requests_after_pages")),
    (
        lambda r: (
            f"POST /translate under {dig(r, 'reconnecting_never_readers', 'attackers', 'connections')} "
            f"reconnecting never-readers (target: {FLOORS['reconnecting_never_readers']:.0%} answered 200 within 1 s)"
        ),
        under_attack("reconnecting_never_readers"),
    ),
    (lambda r: "never-readers closed by the server (each reopened at once)", reopened),
    (lambda r: "POST /translate after them", requests("requests_after_reconnecting")),
    (
        lambda r: "the server's resident memory, MiB: before / after the pages / after the reconnecting",
        memory("before", "pages", "reconnecting"),
    ),
]


def flood_block(runs: tuple[tuple[str, Path], ...] = FLOOD_RUNS) -> str:
    """The held connections, slow readers and burst of each run, side by side, after the runs' sources."""
    return "\n".join([*sources(runs), "", *table(runs, FLOOD_ROWS)])


def pages_block(runs: tuple[tuple[str, Path], ...] = PAGE_RUNS) -> str:
    """The page readers, chunkers and reconnecting never-readers of each run, side by side, after their sources."""
    return "\n".join([*sources(runs), "", *table(runs, PAGE_ROWS)])


def latency_block(path: Path = LATENCY) -> str:
    """Start-up and latency of nmt-serve from serve_latency.json: the median and range of each, and the slowest
    checkpoint's own model time beside a request's."""
    report = load(path)
    n, starts = len(report["checkpoints"]), report["startup_s"]
    lines = [
        *sources((("measured", path),), "serve_latency.py"),
        "",
        "| what | figure |",
        "|---|---|",
        f"| start `nmt-serve` with {n} checkpoints -> first page served | {report['startup_median_s']:.2f} s, "
        f"median of {len(starts)} starts ({min(starts):.2f}-{max(starts):.2f}) |",
    ]
    for run in report["latency"]:
        what = "greedy" if run["beam"] == 1 else f"beam {run['beam']}"
        slowest = max(run["model_median_s"].values())
        lines.append(
            f"| POST /translate, a {report['words']}-word test sentence, {n} checkpoints, {what} | "
            f"{run['median_s'] * 1000:.0f} ms, median of {run['requests']} requests "
            f"({run['min_s'] * 1000:.0f}-{run['max_s'] * 1000:.0f}); the slowest checkpoint's own median "
            f"{slowest * 1000:.0f} ms |"
        )
    return "\n".join(lines)
