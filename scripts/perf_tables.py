"""The figures of docs/performance.md and the README's first run, written from the committed JSON files under
docs/benchmark/ (scripts/readme_tables.py puts each block between its markers; a test checks them):

- by_kind_block: one row per CPU kind and precision, the newest side-by-side run of `scripts/benchmark.py
  --peer opennmt` of that kind (train_multi30k_*.json), with the range of training's ratio over every
  committed run of the kind; kinds with no run say so;
- busy_block: `scripts/busy_machine.py`'s medians per load and thread count (busy_machine_*.json);
- malloc_block: `scripts/memory_trace.py` under each malloc (memory_trace_malloc_*.json);
- first_run_block: `scripts/first_run.py`'s run of the README's first command (first_run_*.json);
- suite_block: `scripts/suite_time.py`'s run of the whole test suite (test_suite_*.json), or a line saying that
  none is committed.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH_DIR = ROOT / "docs" / "benchmark"
# OpenNMT-py's recipe (../shared/peers/opennmt_rnn.yaml) sets no precision: it trains and decodes in fp32
PEER = {"opennmt": ("OpenNMT-py 3.5.1", "fp32"), "joeynmt": ("JoeyNMT 2.3.0", "fp32")}
# nmt.device.cpu_kind's kinds, most common first; a kind without a committed run gets a row saying so
# (a run with `device=cuda` is a CUDA row whatever its CPU)
KINDS = {
    "AVX2": "no AVX-512, no bf16 hardware",
    "AVX512": "without BF16",
    "AVX512_BF16": "no AMX",
    "AMX": "an Intel Xeon with AMX",
    "CUDA": "a GPU, `device=cuda`",
}


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def rel(path: Path) -> str:
    try:
        return path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return path.as_posix()


def precision(bench: dict) -> str:
    """nmt's training precision in a scripts/benchmark.py report: fp32 (`amp` off) or bf16."""
    return "fp32" if bench["train"]["amp"] in ("off", "fp32", None) else str(bench["train"]["amp"])


def kind_of(bench: dict) -> str:
    """The row's kind: CUDA for a run on a GPU, else the CPU's, or 'AVX2, emulated on <kind>' for a run under
    --emulate-avx2."""
    if str(bench.get("device") or "cpu").startswith("cuda"):
        return "CUDA"
    machine = bench["machine"]
    if machine.get("emulated"):
        return f"{str(machine['emulated']).upper()}, emulated on {machine.get('cpu_kind')}"
    return str(machine.get("cpu_kind") or machine.get("cpu_capability") or "not recorded")


def peer_of(bench: dict) -> tuple[str, dict | None]:
    name, peer = next(iter((bench.get("peers") or {}).items()), (None, None))
    return name, (peer["figures"] if peer and peer.get("ok") else None)


def side_by_side_runs(folder: Path = BENCH_DIR) -> dict[tuple[str, str], list[tuple[dict, Path]]]:
    """(kind, precision) -> [(report, path)], newest first, of every committed side-by-side training run."""
    groups: dict[tuple[str, str], list[tuple[dict, Path]]] = {}
    for path in sorted(folder.glob("train_multi30k_*.json")):
        bench = load(path)
        groups.setdefault((kind_of(bench), precision(bench)), []).append((bench, path))
    return {key: sorted(runs, key=lambda r: r[0]["date"], reverse=True) for key, runs in groups.items()}


def _x(ours: float, theirs: float) -> str:
    return f"{ours / theirs:.2f}x"


def by_kind_block(folder: Path = BENCH_DIR) -> str:
    """The table of performance.md's "By kind of CPU"."""
    groups = side_by_side_runs(folder)
    head = [
        "| CPU kind | precision: nmt / peer | training sentences/s: nmt / peer | every run of this kind | "
        "beam-5 decode only, s | greedy decode only, s | test BLEU beam 5 | peak training GiB | CPU; date (file) |",
        "|---|---|---:|---|---:|---:|---:|---:|---|",
    ]
    rows = []
    order = [*KINDS, *sorted({k for k, _ in groups} - set(KINDS))]
    for kind in order:
        keys = sorted(key for key in groups if key[0] == kind)
        if not keys and kind in KINDS:
            rows.append(f"| {kind} ({KINDS[kind]}) | - | not measured | - | - | - | - | - | - |")
        for key in keys:
            runs = groups[key]
            bench, path = runs[0]
            name, theirs = peer_of(bench)
            label, peer_precision = PEER.get(name, (name, "?"))
            ours = bench["figures"]
            ratios = [b["figures"]["sentences_per_s"] / p["sentences_per_s"] for b, _ in runs for p in [peer_of(b)[1]]]
            others = ", ".join(rel(other) for _, other in runs[1:])
            spread = (
                f"{len(runs)} runs: {min(ratios):.2f}-{max(ratios):.2f}x (the others: {others})" if others else "1 run"
            )
            described = KINDS.get(kind, "not a real machine of that kind: the bigger CPU's caches and clock stay")
            rows.append(
                f"| {kind} ({described}) | {key[1]} / {peer_precision} ({label}) | "
                f"{ours['sentences_per_s']:.1f} / {theirs['sentences_per_s']:.1f}: "
                f"**{_x(ours['sentences_per_s'], theirs['sentences_per_s'])}** | {spread} | "
                f"{ours['decode_s_beam5']:.2f} / {theirs['decode_s_beam5']:.2f} "
                f"({_x(theirs['decode_s_beam5'], ours['decode_s_beam5'])} faster) | "
                f"{ours['decode_s_greedy']:.2f} / {theirs['decode_s_greedy']:.2f} "
                f"({_x(theirs['decode_s_greedy'], ours['decode_s_greedy'])} faster) | "
                f"{ours['bleu_beam5']:.2f} / {theirs['bleu_beam5']:.2f} | "
                f"{ours['peak_train_gib']:.2f} / {theirs['peak_train_gib']:.2f} | "
                f"{bench['machine'].get('cpu_model')}, {bench['machine'].get('malloc')} malloc, "
                f"{bench['machine'].get('threads')} threads; {bench['date'][:10]} ({rel(path)}) |"
            )
    return "\n".join([*head, *rows])


def busy_block(folder: Path = BENCH_DIR) -> str:
    """One table per busy_machine_*.json: median seconds of training per load and thread count, the range
    over the repeats, what auto chose, and the floor's verdict."""
    out = []
    for path in sorted(folder.glob("busy_machine_*.json")):
        report = load(path)
        threads = list(report["median_train_s"]["quiet"])
        runs = report["runs"]
        out += [
            f"`{report['command']}`: {report['machine'].get('cpu_model')} ({report['machine'].get('cpu_kind')}), "
            f"{report['steps']} steps of `experiment=quick`, {max(r['repeat'] for r in runs) + 1} repeat(s); "
            f"{report['date'][:10]} ({rel(path)}). Median seconds of training [range]:",
            "",
            "| load | " + " | ".join(f"threads={t}" for t in threads) + " | floor |",
            "|---|" + "---:|" * len(threads) + "---|",
        ]
        for load_name, label in (("quiet", "quiet"), ("busy", "one busy process beside it")):
            cells = []
            for t in threads:
                times = [r["train_s"] for r in runs if r["load"] == load_name and r["threads"] == t]
                cell = f"{statistics.median(times):.1f}"
                cell += f" [{min(times):.1f}-{max(times):.1f}]" if len(times) > 1 else ""
                chose = sorted({r["threads_used"] for r in runs if r["load"] == load_name and r["threads"] == t})
                cells.append(cell + (f" (chose {', '.join(map(str, chose))})" if t == "auto" else ""))
            floor = next((f for name, f in report["floors"].items() if name.startswith(load_name)), None)
            verdict = f"{floor['ratio']:.3f}, at most {floor['at_most']}: {'met' if floor['met'] else 'not met'}"
            out.append(f"| {label} | " + " | ".join(cells) + f" | {verdict if floor else '-'} |")
        out.append("")
    return "\n".join(out).rstrip()


def malloc_block(folder: Path = BENCH_DIR) -> str:
    """Steps, speed and peak memory of the same training under each malloc (memory_trace_malloc_*.json)."""
    out = []
    for path in sorted(folder.glob("memory_trace_malloc_*.json")):
        report = load(path)
        out += [
            f"{report['machine']}; {report['date'][:10]} ({rel(path)}):",
            "",
            "| malloc | seconds | steps | sentences/s | peak resident MiB |",
            "|---|---:|---:|---:|---:|",
            *(
                f"| {r['malloc']} | {r['seconds']} | {r['steps']} | {r['sentences_per_s']:.1f} | "
                f"{r['peak_resident_mib']:,} |"
                for r in report["runs"]
            ),
            "",
        ]
    return "\n".join(out).rstrip()


def newest(folder: Path, pattern: str) -> tuple[dict, Path] | None:
    """The newest report (by its date) of the files matching `pattern`, and its path; None without one."""
    found = sorted(((load(p), p) for p in folder.glob(pattern)), key=lambda r: r[0]["date"], reverse=True)
    return found[0] if found else None


def first_run_block(folder: Path = BENCH_DIR) -> str:
    """The README's figures of its first command, from the newest first_run_*.json."""
    if not (found := newest(folder, "first_run_*.json")):
        return "No first run is committed yet (`python scripts/first_run.py --out ...` writes one)."
    run, path = found
    machine = run["machine"]
    load_avg = max(run["load_average_before"][0], run["load_average_after"][0])
    shared = (
        f"a shared machine: load average up to {load_avg:.1f} on its {machine.get('cores')} cores from other work"
        if load_avg > 0.5 * (machine.get("cores") or 1)
        else "a quiet machine"
    )
    threads = run.get("threads") or {}
    return (
        f"Measured with `python scripts/first_run.py` ([{path.name}]({rel(path)})): "
        f"`{run['command']}` took {run['process_s'] / 60:.1f} minutes from start to exit "
        f"({run['train_minutes']:.1f} of them training), {run['steps']:,} steps, validation BLEU "
        f"{run['valid_bleu_last']:.1f} at the last step, {run['peak_rss_gib']:.2f} GiB peak; "
        f"{machine.get('cpu_model')} ({machine.get('cpu_kind')}: {'bf16' if machine.get('native_bf16') else 'fp32'}), "
        f"{threads.get('count')} thread(s) chosen by `trainer.threads={threads.get('setting')}`, "
        f"{machine.get('malloc')} malloc, torch {machine.get('torch')}, {shared}; {run['date'][:10]}. "
        f'`nmt-translate` with its best.pt answered "{run["translation"]}" in {run["translate_s"]:.1f} s '
        "for the whole command."
    )


def suite_block(folder: Path = BENCH_DIR) -> str:
    """The test suite's time from the newest test_suite_*.json, or a line saying none is committed."""
    if not (found := newest(folder, "test_suite_*.json")):
        return "The suite's time on a 2-core machine is not committed yet (`python scripts/suite_time.py --out ...`)."
    run, path = found
    machine = run["machine"]
    return (
        f"The suite (`{run['command']}`) took {run['seconds'] / 60:.1f} minutes ({run['summary']}) on "
        f"{machine.get('cores')} cores of an {machine.get('cpu_model')}, load average "
        f"{run['load_average_before'][0]:.1f} before it; {run['date'][:10]} ([{path.name}]({rel(path)}))."
    )


# the machines docs/performance.md's plan table describes: (name, device, bf16, why bf16 or not)
PLAN_MACHINES = (
    ("CPU without bf16 hardware (AVX2; AVX-512 without BF16)", "cpu", False, "no native bf16: fp32"),
    ("CPU with AVX-512 BF16 or AMX", "cpu", True, "native bf16"),
    ("CUDA GPU", "cuda", True, "bf16 on the GPU"),
)


def plan_block() -> str:
    """What `kernels=auto` chooses for the multi30k_deen preset's model (additive score in Luong's order, input
    feeding, a one-layer biLSTM encoder) at 2 threads on each kind of machine, where a C++ compiler is found:
    nmt.plan.choose itself, so the table is the code's own answer."""
    from nmt import plan
    from nmt.kernels import compiled

    shape = plan.Shape(additive=True, input_feeding=True, query_previous=False)
    found, has = compiled.compiler, compiled.has_compiler
    compiled.compiler, compiled.has_compiler = (lambda: "c++"), (lambda: True)
    try:
        plans = [
            plan.choose(plan.Inputs(device, bf16, why, "auto", 2, "2 cores", "train"), shape).record()
            for _, device, bf16, why in PLAN_MACHINES
        ]
    finally:
        compiled.compiler, compiled.has_compiler = found, has
    lines = ["| component | " + " | ".join(m[0] for m in PLAN_MACHINES) + " |", "|---|" + "---|" * len(plans)]
    for component in plans[0]:
        cells = [p.get(component, {}).get("implementation", "-") for p in plans]
        lines.append(f"| `{component}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)
