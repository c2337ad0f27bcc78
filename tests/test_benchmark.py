"""scripts/benchmark.py runs on a tiny setting and writes valid JSON; speeds are never asserted.

    python -m pytest -q tests/test_benchmark.py

The peers are stand-in scripts here (one writes a summary in the peers' format, one fails), so no peer
toolkit is installed; the FLOPs formula and the peer summary parsing are checked as plain functions.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nmt.attention import ATTENTIONS
from nmt.cpu import AVX2_EMULATION, CPU_FLAGS, cpu_flags, cpu_kind
from nmt.memory import ENV_DEFAULTS
from nmt.model import ModelConfig

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "benchmark.py"

FAKE_OPENNMT = """set -eu
mkdir -p "$WORK"
cat > "$WORK/onmt_summary.json" <<JSON
{"params": 13060000, "sent_per_s_overall": 145.7, "tgt_tok_per_s_overall": 2280.0,
 "train_maxrss_mb_wall": [3788.8, "12:03.51"],
 "decode_b1": {"total_translation_secs": ["3.2"], "maxrss_mb_wall": [900.0, "0:08.10"], "bleu": "32.27"},
 "decode_b5": {"total_translation_secs": ["10.0"], "maxrss_mb_wall": [950.0, "1:15.50"], "bleu": "33.01"},
 "env": {"train_seconds": "$TRAIN_SECONDS", "threads": "$THREADS", "data": "$DATA",
         "lru": "${LRU_CACHE_CAPACITY:-unset}"}}
JSON
echo "fake opennmt done"
"""
FAKE_JOEYNMT = """echo "joeynmt: something went wrong" >&2
exit 3
"""


def load_benchmark():
    spec = importlib.util.spec_from_file_location("benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_benchmark(tmp: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp / "b.json"
    cmd = [
        sys.executable,
        str(SCRIPT),
        "--tiny",
        "--threads",
        "1",
        "--matmul-seconds",
        "0.2",
        "--out",
        str(out),
        "--work",
        str(tmp / "work"),
        *args,
    ]
    env = {k: v for k, v in os.environ.items() if k not in ENV_DEFAULTS}  # as a user's shell would start it
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc, json.loads(out.read_text())


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess, dict]:
    """One tiny benchmark with a stand-in OpenNMT-py that succeeds and a stand-in JoeyNMT that fails."""
    tmp = tmp_path_factory.mktemp("benchmark")
    peers = tmp / "peers"
    peers.mkdir()
    (peers / "opennmt.sh").write_text(FAKE_OPENNMT)
    (peers / "joeynmt.sh").write_text(FAKE_JOEYNMT)
    proc, report = run_benchmark(tmp, "--peer", "opennmt", "--peer", "joeynmt", "--peer-dir", str(peers))
    return tmp, proc, report


def positive(section: dict, *keys: str) -> None:
    for key in keys:
        assert isinstance(section[key], (int, float)) and section[key] > 0, (key, section[key])


def test_tiny_run_writes_the_expected_json(tiny):
    _, _, report = tiny
    for key in (
        "command",
        "date",
        "args",
        "overrides",
        "machine",
        "matmul",
        "train",
        "decode",
        "model",
        "flops",
        "figures",
        "peers",
        "floors",
        "peak_rss_gib",
    ):
        assert key in report, key
    assert "benchmark.py --tiny" in report["command"]
    machine = report["machine"]
    assert machine["threads"] == 1 and machine["cores"] >= 1 and machine["cpu_model"] and machine["torch"]
    assert machine["cpu_capability"] and isinstance(machine["native_bf16"], bool)  # which CPU kind: in every report
    assert machine["cpu_kind"] == cpu_kind(machine["cpu_flags"]) and set(machine["cpu_flags"]) == set(CPU_FLAGS)
    assert report["emulated"] is None and machine["emulated"] is None
    positive(report["matmul"], "gflops", "calls", "seconds")
    positive(report["matmul_bf16"], "gflops", "calls", "seconds")
    assert (report["matmul"]["dtype"], report["matmul_bf16"]["dtype"]) == ("float32", "bfloat16")
    assert report["matmul"]["device"] == report["device"] == "cpu" and report["matmul"]["n"] == 512
    # measured again right after training: fp32 always, bf16 where training ran in bf16
    positive(report["matmul_after"], "gflops", "calls", "seconds")
    assert report["matmul_after"]["dtype"] == "float32"
    assert ("matmul_bf16_after" in report) == (report["train"]["amp"] == "bf16")
    assert report["train"]["amp"] in ("bf16", "off") and report["train"]["bucketing"] in ("exact", "sorted")
    positive(
        report["train"],
        "sentences_per_s",
        "target_tokens_per_s",
        "train_seconds",
        "steps",
        "sentences",
        "target_tokens",
        "peak_rss_gib",
        "padding_overhead",
    )
    assert report["train"]["padding_overhead"] >= 1
    plan = report["train"]["plan"]  # nmt.plan: every component with its reason (--tiny: kernels=eager)
    assert len(plan) >= 6 and plan["encoder"]["reason"] == "kernels=eager"
    assert Path(report["train"]["checkpoint"]).is_file()
    for label, beam in (("greedy", 1), ("beam5", 5)):
        dec = report["decode"][label]
        assert dec["beam"] == beam and dec["sentences"] == 20
        positive(dec, "decode_seconds", "process_seconds", "sentences_per_s", "warmup_seconds")
        assert dec["kernels"] in ("compiled", "eager") and dec["plan"]["beam_topk"]["reason"]
        assert 0 <= dec["bleu"] <= 100 and dec["process_output_matches"] is True
        assert dec["precision"] in ("bf16", "fp32") and ("fp32" in dec) == (dec["precision"] == "bf16")
        assert dec["precision_reason"].startswith("amp=auto: ")  # why bf16 or not, in words
        if "fp32" in dec:
            assert dec["fp32"]["precision"] == "fp32" and 0 <= dec["fp32"]["bleu"] <= 100
    flops = report["flops"]
    positive(
        flops,
        "train_gflop_per_sentence",
        "achieved_gflops",
        "fraction_of_matmul",
        "fraction_of_matmul_after",
        "fraction_of_matmul_mean",
        "mean_src_pieces",
        "mean_tgt_pieces",
    )
    rates = (report["matmul_bf16"], report["matmul_bf16_after"]) if report["train"]["amp"] == "bf16" else None
    rates = rates or (report["matmul"], report["matmul_after"])
    assert (flops["matmul_gflops"], flops["matmul_gflops_after"]) == tuple(r["gflops"] for r in rates)
    for key, rate in (("fraction_of_matmul", rates[0]), ("fraction_of_matmul_after", rates[1])):
        assert flops[key] == pytest.approx(flops["achieved_gflops"] / rate["gflops"], rel=1e-2, abs=1e-4)
    assert flops["fraction_of_matmul_mean"] == pytest.approx(
        (flops["fraction_of_matmul"] + flops["fraction_of_matmul_after"]) / 2, abs=1e-4
    )
    positive(report["model"], "parameters")
    assert len(report["floors"]) == 6


def test_peers_side_by_side_and_a_failing_peer(tiny):
    _, proc, report = tiny
    onmt = report["peers"]["opennmt"]
    data = str((ROOT / "../shared/data/multi30k").resolve())
    # the peer runs in the user's environment, without the memory settings our benchmark process took
    assert onmt["ok"] and onmt["summary"]["env"] == {"train_seconds": "3", "threads": "1", "data": data, "lru": "unset"}
    assert report["allocator"]["LRU_CACHE_CAPACITY"] == "128"
    assert onmt["figures"]["process_s_beam5"] == pytest.approx(75.5)
    assert onmt["figures"]["peak_train_gib"] == pytest.approx(3.7)
    joey = report["peers"]["joeynmt"]
    assert not joey["ok"] and joey["returncode"] == 3
    assert any("something went wrong" in line for line in joey["log_tail"])
    assert "something went wrong" in proc.stderr  # the failing peer's log tail is shown
    assert "| metric | ours | opennmt | ours/opennmt |" in proc.stdout  # the failed peer gets no column
    assert proc.stdout.startswith(f"machine: {report['machine']['cpu_model']} ({report['machine']['cpu_kind']}")
    assert "| achieved fraction of the matmul rate" in proc.stdout and "before / after training, mean |" in proc.stdout
    assert report["floors"][0]["basis"] == "OpenNMT-py, this run"


def test_skip_train_only_decodes(tiny):
    tmp, _, first = tiny
    proc, report = run_benchmark(tmp / "again", "--skip-train", first["train"]["checkpoint"])
    assert report["train"] is None and "matmul_after" not in report  # no training: nothing to measure after
    assert report["decode"]["greedy"]["sentences"] == 20
    assert report["flops"]["achieved_gflops"] is None and report["flops"]["train_gflop_per_sentence"] > 0
    assert "| test BLEU beam 5 |" in proc.stdout


def test_flops_formula_of_the_multi30k_model():
    bench = load_benchmark()
    # the defaults: biLSTM 2x256 encoder, LSTM-512 decoder, 256-d embeddings, input feeding, bridge
    cfg = ModelConfig(attention="bahdanau", attention_query="current")
    S, T, V = 16, 15, 8000
    encoder = 2 * 8 * 256 * (256 + 256)  # per source piece, both directions
    keys = 2 * 512 * 512
    step = 8 * 512 * (256 + 512 + 512) + 2 * 512 * 512 + 2 * (512 + 512) * 512 + 2 * 512 * V
    expected = S * (encoder + keys) + 4 * 512 * 512 + T * step + S * T * (2 * 512 + 2 * 512)
    assert bench.forward_flops(cfg, V, S, T) == expected
    assert 0.7e9 < 3 * expected < 0.9e9  # the peers' README: ~0.83 GFLOP per training sentence
    cfg.self_attention_layers = 2  # each: W_q, W_k, W_v, W_o on every position, and S x S scores and reads
    layer = S * 4 * 2 * 512 * 512 + S * S * 2 * 2 * 512
    assert bench.forward_flops(cfg, V, S, T) == expected + 2 * layer


@pytest.mark.parametrize("attention", sorted(ATTENTIONS))
def test_flops_are_counted_for_every_attention(attention):
    cfg = ModelConfig(attention=attention, decoder_layers=2, encoder_layers=2)
    assert load_benchmark().forward_flops(cfg, 100, 7, 9) > 0


def test_peer_summaries_are_read_with_missing_fields():
    bench = load_benchmark()
    joey = {
        "params_ckpt": 13180000,
        "sent_per_s_overall": 63.7,
        "trg_tok_per_s_overall": 1000.0,
        "train_maxrss_mb_wall": [1945.6, "12:00.20"],
        "decode_b1": {"generation_secs": [5.0, 5.5], "maxrss_mb_wall": [700.0, "0:14.00"], "bleu": "8.69"},
    }
    figures = bench.peer_figures("joeynmt", joey)
    assert figures["decode_s_greedy"] == pytest.approx(10.5) and figures["process_s_greedy"] == 14.0
    assert figures["bleu_greedy"] == 8.69 and figures["peak_train_gib"] == pytest.approx(1.9)
    assert figures["bleu_beam5"] is None and figures["decode_s_beam5"] is None
    assert bench.peer_figures("opennmt", {})["sentences_per_s"] is None


def test_step_benchmark_times_each_variant_on_the_long_examples_and_writes_json(tmp_path):
    """scripts/step_benchmark.py on a tiny synthetic setting: every variant named runs and is reported; with
    --min-source N only training examples whose source has N pieces or more are timed (batches of the same
    batch_tokens), and the JSON says so, with the timed batches' mean source length; none that long is an error,
    and so is an unknown variant."""
    out = tmp_path / "steps.json"
    tiny = [
        "data=synthetic",
        "data.train_size=200",
        "data.valid_size=10",
        "data.test_size=10",
        "data.max_len=8",
        "tokenizer.vocab_size=60",
        "model.embed_size=16",
        "model.encoder_hidden_size=16",
        "model.hidden_size=32",
        "trainer.batch_tokens=200",
        f"paths.data_dir={tmp_path / 'data'}",
    ]
    script = str(SCRIPT.parent / "step_benchmark.py")
    cmd = [sys.executable, script, "fp32-sorted", "bf16-exact-nofeed", "--steps", "2", "--threads", "1", "--data", ""]
    proc = subprocess.run(
        [*cmd, "--out", str(out), "--min-source", "7", "--", *tiny], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert list(report["results"]) == ["fp32-sorted", "bf16-exact-nofeed"] and report["min_source"] == 7
    for name, r in report["results"].items():
        assert r["steps"] == 2 and r["sentences_per_s"] > 0 and r["target_tokens_per_s"] > 0, name
        assert r["mean_source_pieces"] >= 7 and r["sentences_per_batch"] > 0, name
    assert report["results"]["fp32-sorted"]["ratio"] == 1.0
    assert report["results"]["bf16-exact-nofeed"]["input_feeding"] is False
    assert report["machine"]["cpu_model"] and report["machine"]["threads"] == 1
    assert "bf16-exact-nofeed" in proc.stdout
    none = subprocess.run([*cmd, "--min-source", "500", "--", *tiny], capture_output=True, text=True, timeout=300)
    assert none.returncode != 0 and "--min-source 500: no training example" in none.stderr
    bad = subprocess.run([sys.executable, script, "fp16"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown variant(s) fp16" in bad.stderr


def test_peer_decode_time_is_this_runs_and_table_reprints_a_report(tiny, tmp_path):
    """A reused --work appends to the peer's decode log: the last time is this run's. --table re-prints."""
    tmp, _, report = tiny
    bench = load_benchmark()
    summary = json.loads(json.dumps(report["peers"]["opennmt"]["summary"]))
    summary["decode_b5"]["total_translation_secs"] = ["11.8", "10.4"]  # an earlier run's, then this run's
    assert bench.peer_figures("opennmt", summary)["decode_s_beam5"] == 10.4
    saved = tmp_path / "report.json"
    saved.write_text(json.dumps(report))
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--table", str(saved), "--out", str(tmp_path / "again.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| training sentences/s (validation excluded) |" in proc.stdout and "| floor" in proc.stdout
    again = json.loads((tmp_path / "again.json").read_text())
    assert again["figures"] == report["figures"] and again["floors"] == report["floors"]


def test_memory_trace_records_every_step(tmp_path):
    """scripts/memory_trace.py on its tiny setting: a row per optimizer step, memory figures > 0."""
    out = tmp_path / "trace.json"
    cmd = [
        sys.executable,
        str(SCRIPT.parent / "memory_trace.py"),
        "--tiny",
        "--seconds",
        "1.5",
        "--threads",
        "1",
        "--every",
        "1",
        "--work",
        str(tmp_path / "work"),
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["steps"] == len(report["trace"]) > 0 and report["end"] == report["trace"][-1]
    assert all(row["resident"] > 0 for row in report["trace"])
    assert [row["seconds"] for row in report["trace"]] == sorted(row["seconds"] for row in report["trace"])
    assert report["peak_resident_mib"] >= max(row["resident"] for row in report["trace"]) - 1
    if "heap_in_use" in report["end"]:  # glibc
        assert report["end"]["heap_in_use"] > 0 and report["end"]["heap_free"] >= 0
    assert f"step {report['steps']}:" in proc.stdout


def test_elementwise_benchmark_reports_every_kernel(tmp_path):
    """scripts/elementwise_benchmark.py: a row per thread count, dtype and kernel; the sigmoid form that
    nmt.kernels.energy uses is within 1e-6 of fp64 tanh. Speeds are never asserted."""
    out = tmp_path / "elementwise.json"
    cmd = [sys.executable, str(SCRIPT.parent / "elementwise_benchmark.py"), "--elements", "4096", "--threads", "1"]
    proc = subprocess.run([*cmd, "--seconds", "0.01", "--out", str(out)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    kernels = {"tanh_", "sigmoid form", "sigmoid_", "exp_", "add"}
    assert {(r["dtype"], r["kernel"]) for r in report["results"]} == {
        (d, k) for d in ("float32", "bfloat16") for k in kernels
    }
    assert all(r["threads"] == 1 and r["ns"] >= 0 for r in report["results"])
    assert report["max_abs_error"]["sigmoid form"] < 1e-6 and report["machine"]["threads"] == 1
    assert "sigmoid form" in proc.stdout


@pytest.mark.parametrize("attention, min_source", [("luong", 0), ("bahdanau", 4)])
def test_step_profile_splits_the_step_into_phases(tmp_path, attention, min_source):
    """scripts/step_profile.py on a tiny synthetic setting: the phases sum to the step, the matmul-heavy ones
    have FLOPs, the attention is timed in both decoder orders (stepwise queries and all steps at once), and
    --ops lists the operators with the most self time, most first. --min-source N (bahdanau's run): the profile's
    batches hold only examples whose source has N pieces or more (the JSON says N); none that long is an error.
    Bahdanau's run is also --emulate-avx2 where the CPU has AVX2: torch's kernels AVX2, fp32, and said so."""
    out = tmp_path / "profile.json"
    tiny = ["experiment=quick", f"attention={attention}", "model.input_feeding=false", "data.train_size=300"]
    if min_source:
        tiny.append("trainer.batch_tokens=300")
    cmd = [
        sys.executable,
        str(SCRIPT.parent / "step_profile.py"),
        "--steps",
        "2",
        "--threads",
        "1",
        "--data",
        "",
        "--matmul-seconds",
        "0.2",
    ]
    overrides = ["--", *tiny, f"paths.data_dir={tmp_path / 'data'}"]
    options = dict(capture_output=True, text=True, timeout=300, cwd=ROOT)
    emulate = ["--emulate-avx2"] if min_source and cpu_flags()["avx2"] else []
    profile = [*cmd, *emulate, "--ops", "5", "--out", str(out), "--min-source", str(min_source), *overrides]
    proc = subprocess.run(profile, **options)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    if emulate:
        assert report["emulated"] == "avx2" and report["machine"]["cpu_capability"] == "AVX2"
        assert report["overrides"][-1] == "trainer.amp=off" and report["machine"]["native_bf16"] is False
        assert proc.stdout.startswith("EMULATED AVX2 (" + " ".join(f"{k}={v}" for k, v in AVX2_EMULATION.items()))
    else:
        assert report["emulated"] is None
    assert report["min_source"] == min_source and report["target_tokens"] > 0
    phases = report["phases"]
    assert list(phases) == ["encoder", "recurrence without attention", "attention", "output+loss", "optimizer"]
    assert sum(p["seconds"] for p in phases.values()) == pytest.approx(report["step_seconds"], abs=0.01)
    assert all(phases[name]["gflop"] > 0 for name in ("encoder", "recurrence without attention", "output+loss"))
    assert phases["attention"]["seconds"] > 0 and report["machine"]["threads"] == 1
    assert "whole step" in proc.stdout
    ops = report["operators"]
    assert len(ops) == 5 and all(op["calls"] > 0 and op["self_seconds"] > 0 for op in ops)
    assert [op["self_seconds"] for op in ops] == sorted((op["self_seconds"] for op in ops), reverse=True)
    assert 0 < sum(op["share"] for op in ops) <= 1 and ops[0]["name"][:60] in proc.stdout
    assert sum(op["self_seconds"] for op in ops) <= report["profiled_seconds"] + 1e-3
    if min_source:
        assert report["batches"] == 2
        none = subprocess.run([*cmd, "--min-source", "900", *overrides], **options)
        assert none.returncode != 0 and "--min-source 900: no training example" in none.stderr


def test_emulated_avx2_trains_in_fp32_and_the_table_says_it_is_an_emulation(tiny, tmp_path):
    """--emulate-avx2: trainer.amp=off after every override; a report that says `emulated: avx2` (as
    nmt.cpu.emulate_avx2's process writes) opens its table with an emulation's plain words; --table
    re-prints it so."""
    bench = load_benchmark()
    args = bench.parse_args(["--tiny", "--emulate-avx2", "trainer.amp=bf16"])
    cfg, overrides = bench.benchmark_config(args, tmp_path)
    assert overrides[-1] == "trainer.amp=off" and cfg.trainer.amp == "off"
    report = json.loads(json.dumps(tiny[2]))
    report["emulated"] = "avx2"
    table = bench.format_table(report)
    assert table.startswith("**EMULATED AVX2** (ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 ")
    assert "not a real AVX2 machine" in table.splitlines()[0]
    assert not bench.format_table(tiny[2]).startswith("**EMULATED")


def test_step_profile_counts_the_flops_of_onednns_lstm():
    """torch's FLOP counter has no formula for aten::mkldnn_rnn_layer (nn.LSTM on a CPU) and counted 0 for the
    encoder's LSTM; step_profile teaches it: 3 x the gate matmuls of every token, direction and layer."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    spec = importlib.util.spec_from_file_location("step_profile", SCRIPT.parent / "step_profile.py")
    sys.path.insert(0, str(SCRIPT.parent))  # it imports its neighbour step_benchmark
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPT.parent))
    module.count_lstm_flops()
    module.count_lstm_flops()  # a second call changes nothing
    rnn = torch.nn.LSTM(32, 16, batch_first=True, bidirectional=True, num_layers=2)
    with FlopCounterMode(display=False) as counter:
        rnn(torch.randn(5, 7, 32))[0].sum().backward()
    per_token_direction = 2 * 4 * 16 * (32 + 16)  # both layers read 32 inputs (the second: 2 x 16)
    counted = counter.get_total_flops()
    if torch.backends.mkldnn.is_available() and counted:  # where nn.LSTM takes oneDNN's layer
        assert counted == 3 * 5 * 7 * 2 * 2 * per_token_direction
