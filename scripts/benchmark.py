"""python scripts/benchmark.py [--peer opennmt|joeynmt] [--train-seconds 720] [--emulate-avx2] [--out FILE] [K=V ...]

Speed, memory and quality of the `multi30k_deen` preset on this machine, optionally side by side with a
peer toolkit trained by the recipes in ../shared/peers on the same data, budget and thread count:

    python scripts/benchmark.py                                  # ours only: 12 min training, then decoding
    python scripts/benchmark.py --peer opennmt --peer joeynmt    # then each peer's recipe, and ratios
    python scripts/benchmark.py --skip-train run/checkpoints/last.pt     # decoding only
    python scripts/benchmark.py --tiny --out /tmp/b.json         # a few seconds on a synthetic task (tests)
    python scripts/benchmark.py --table old.json                 # re-print an earlier report's table
    python scripts/benchmark.py --emulate-avx2 --peer opennmt    # fp32 with torch kept to AVX2 (not an AVX2 CPU)
    python scripts/benchmark.py trainer.batch_tokens=3000 --override model.dropout=0.2

What it measures, in order:
  1. the machine's fp32 and bf16 matmul rates: a 512^3 torch.mm for --matmul-seconds each at --threads threads
     (the machine record has the CPU's kind, AVX2 / AVX512 / AVX512_BF16 / AMX, and the /proc/cpuinfo flags
     that decide it, beside torch's CPU capability);
  2. training (in this process, nmt.trainer.Trainer) for --train-seconds of wall clock, validations included
     in the budget as in the peers' TRAIN_SECONDS (data preparation and start-up are outside it and reported
     apart); validation runs only at the end unless trainer.valid_every is overridden. Sentences/s and target
     tokens/s divide by the training time with every validation taken out; the padding overhead is padded /
     real tokens over epoch 0's batches; the peak memory is this whole process's ru_maxrss right after
     training (data preparation included);
  3. the matmul rates again right after training, in the same process (fp32, and bf16 where training ran
     under bf16 autocast): a shared machine's speed moves while it trains;
  4. model FLOPs per training sentence, counted from the model config and the training set's mean lengths
     (see `forward_flops`), and the fraction of the measured matmul rate (bf16 when training ran under bf16
     autocast, else fp32) that training achieves: against the rate before training, after it, and their mean;
  5. decoding of the test split (Multi30k: test_2016_flickr, 1,000 sentences) greedy and beam 5 with the
     last checkpoint: decode-only seconds (Translator.translate in this process) and whole-process seconds
     (`nmt-translate CKPT --beam N < test.src > hyp` timed end to end), with sacreBLEU on detokenized text;
  6. each --peer: `bash <peer-dir>/<peer>.sh` with WORK=<work>/peer, DATA, TRAIN_SECONDS and THREADS, then
     its summary JSON. A failing peer prints its log tail; our figures are still written. The first run in a
     --work folder pip-installs the peer into <work>/peer (network needed); pass the same --work to reuse it.

--emulate-avx2 starts the script again with torch's ATen kernels, oneDNN and MKL kept to AVX2
(nmt.cpu.AVX2_EMULATION) and trainer.amp=off, peers included: fp32 as on an AVX2-only CPU, on this one.
It is not an AVX2 machine (this CPU's caches, clock and memory stay); the JSON says `emulated: avx2` and so
does the table's first line.

The table (markdown) goes to stdout and every raw number to --out (JSON): command, date, args, overrides,
emulated, machine, device, matmul and matmul_bf16 (before training), matmul_after and matmul_bf16_after
(after it; bf16 only where training used it), train (null with --skip-train), decode (greedy, beam5), model,
flops, figures (the table's row values, ours), peers (<name>: ok, summary, figures or error and log_tail),
floors. Performance is only reported, never asserted: the project's targets (floors) are listed with the
figures they compare.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path

import nmt.cli  # noqa: F401  (sets the CPU memory settings of nmt/memory.py: must come before torch)

# isort: split
import torch
from omegaconf import DictConfig

from nmt.cli.common import (
    build_corpus,
    build_run,
    compose_config,
    load_data,
    user_errors,
)
from nmt.cpu import AVX2_EMULATION, emulate_avx2, emulated
from nmt.data import PreparedData
from nmt.device import resolve_device
from nmt.health import Windows, health
from nmt.matmul_rate import matmul_rate
from nmt.memory import tune_allocator, tune_for_decoding, untuned_environment
from nmt.metrics import corpus_scores
from nmt.model import ModelConfig
from nmt.provenance import describe_machine
from nmt.sampler import padding_overhead
from nmt.trainer import Trainer, TrainerHook
from nmt.translator import Translator

log = logging.getLogger("benchmark")

PRESET = "multi30k_deen"
TEST_SPLIT = "test"  # Multi30k: test_2016_flickr
BEAMS = {"greedy": 1, "beam5": 5}
PEERS = {"opennmt": ("opennmt.sh", "onmt_summary.json"), "joeynmt": ("joeynmt.sh", "joey_summary.json")}
NO_VALIDATION = 1_000_000  # trainer.valid_every: validate only once, at the end
# A few seconds on the synthetic task, for the test suite.
TINY_OVERRIDES = [
    "data=synthetic",
    "data.train_size=400",
    "data.valid_size=20",
    "data.test_size=20",
    "data.max_len=8",
    "data.test_max_len=10",
    "data.vocab_words=30",
    "tokenizer.vocab_size=100",
    "model.embed_size=32",
    "model.encoder_hidden_size=32",
    "model.hidden_size=64",
    "trainer.batch_tokens=300",
    # a 3 s budget: nothing to compile (a cold torch.compile under bf16 outlasts it, whatever the preset says)
    "kernels=eager",
]
# OpenNMT-py 3.5.1 in ../shared/peers/README.md (a run on the same kind of machine): used for the
# floors only when no OpenNMT-py run was made in this invocation.
OPENNMT_README = {"sentences_per_s": 145.7, "decode_s_beam5": 10.0, "decode_s_greedy": 3.2, "peak_train_gib": 3.7}


# ------------------------------------------------------------------------------------------ arguments
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="Hydra overrides of the train config")
    p.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Hydra override (repeatable); applied before the trailing ones",
    )
    p.add_argument("--data", default="../shared/data/multi30k", help="folder of the Multi30k .gz files")
    p.add_argument(
        "--train-seconds",
        type=float,
        default=None,
        help="training wall-clock budget, validations included (default 720; --tiny: 3)",
    )
    p.add_argument("--threads", type=int, default=2, help="CPU threads for everything, peers included")
    p.add_argument(
        "--matmul-seconds", type=float, default=None, help="length of the matmul measurement (default 3; --tiny: 0.5)"
    )
    p.add_argument("--out", default=None, help="the JSON report (default benchmark.json; with --table: none)")
    p.add_argument(
        "--peer", action="append", default=[], choices=sorted(PEERS), help="also run this peer's recipe (repeatable)"
    )
    p.add_argument("--peer-dir", default="../shared/peers", help="folder of the peer scripts")
    p.add_argument("--work", default=None, help="scratch folder (default: a new temporary folder)")
    p.add_argument("--skip-train", metavar="CHECKPOINT", default=None, help="do not train; decode this checkpoint")
    p.add_argument("--tiny", action="store_true", help="a synthetic task and a tiny model: seconds, for tests")
    p.add_argument(
        "--emulate-avx2",
        action="store_true",
        help="run again with ATen, oneDNN and MKL kept to AVX2 and trainer.amp=off\n"
        "(fp32 as on an AVX2-only CPU; an emulation, not an AVX2 machine)",
    )
    p.add_argument(
        "--table",
        metavar="JSON",
        default=None,
        help="run nothing: print the table of an earlier report, its peers' figures and the\n"
        "floors recomputed from the raw figures it holds (written back with --out)",
    )
    args = p.parse_intermixed_args(argv)
    if args.train_seconds is None:
        args.train_seconds = 3.0 if args.tiny else 720.0
    if args.matmul_seconds is None:
        args.matmul_seconds = 0.5 if args.tiny else 3.0
    if args.threads < 1 or args.train_seconds <= 0 or args.matmul_seconds <= 0:
        p.error("--threads, --train-seconds and --matmul-seconds must be positive")
    return args


def benchmark_config(args: argparse.Namespace, work: Path) -> tuple[DictConfig, list[str]]:
    """The train config of the preset with the benchmark's settings, then the user's overrides."""
    overrides = [f"experiment={PRESET}"]
    if args.tiny:
        overrides += [*TINY_OVERRIDES, f"paths.data_dir={work / 'data'}"]
    else:
        overrides.append(f"data.root={Path(args.data).resolve()}")
    overrides += [
        f"trainer.max_minutes={args.train_seconds / 60}",
        f"trainer.valid_every={NO_VALIDATION}",
        f"trainer.threads={args.threads}",
        "trainer.progress=false",
        "trainer.heatmaps=0",
        *args.override,
        *args.overrides,
    ]
    if args.emulate_avx2:
        overrides.append("trainer.amp=off")  # last, so it wins: an AVX2-only CPU trains in fp32
    return compose_config(overrides), overrides


# -------------------------------------------------------------------------------------------- machine
def max_rss_gib(who: int = resource.RUSAGE_SELF) -> float:
    """Peak resident set size in GiB (Linux reports ru_maxrss in KiB); RUSAGE_CHILDREN: the largest child."""
    return resource.getrusage(who).ru_maxrss / 1024**2


# ---------------------------------------------------------------------------------------------- FLOPs
def lstm_flops(input_size: int, hidden: int) -> int:
    """One LSTM step of one direction: 4 gates x (W_ih x + W_hh h), 2 FLOPs per multiply-add."""
    return 8 * hidden * (input_size + hidden)


def attention_flops(cfg: ModelConfig, D: int) -> tuple[int, int, int]:
    """(once per source position, once per decoder step, per decoder step and source position) FLOPs.

    Q = decoder hidden size (the query), D = encoder state size, A = additive attention size.
    """
    Q, opts = cfg.hidden_size, cfg.attention_options
    A = opts.get("hidden_size") or Q
    score = opts.get("score", "general")
    table = {
        "none": (0, 0, 0),
        "bahdanau": (2 * D * A, 2 * Q * A, 2 * A + 2 * D),  # W_h h; W_s s; v^T tanh(.) and the context
        "multihead": (4 * D * Q, 2 * Q * Q + 2 * Q * D, 4 * Q),  # K, V; W_Q, W_O; scores and weighted sum
        "local": (2 * D * Q, 2 * Q * Q + 2 * Q, 2 * Q + 2 * D),  # W h; position MLP; scores and context
    }
    if cfg.attention == "luong":
        return {
            "general": (2 * D * Q, 0, 2 * Q + 2 * D),
            "dot": (0, 0, 4 * D),
            "concat": (2 * D * Q, 2 * Q * Q, 2 * Q + 2 * D),
        }[score]
    return table[cfg.attention]


def forward_flops(cfg: ModelConfig, tgt_vocab: int, S, T):
    """Matmul FLOPs of one teacher-forced forward pass over a sentence pair of S source and T target pieces
    (EOS included; S and T may be tensors, the formula is applied elementwise). A multiply-add is 2 FLOPs.

        encoder    S x dirs x 8 He (in + He) per layer             (in = E, then D = dirs x He)
                   + per self-attention layer S x 4 x 2 D^2 (W_q, W_k, W_v, W_o) + S^2 x 2 x 2 D (scores, values)
        attention  S x P  +  T x (R + S x C)                        (P, R, C from `attention_flops`;
                   bahdanau: P = 2 D A, R = 2 H A, C = 2 A + 2 D)
        bridge     2 x 2 D H per decoder layer                      (h and c, once per sentence)
        decoder    T x [8 H (E + H [feed] + D [query=previous] + H) + 8 H (2 H) per extra layer
                        + 2 (D + H) H  (combine W_c)  + 2 H V  (output layer)]

    Training is counted as 3 x forward (backward ~ 2 x forward). Embedding lookups, element-wise
    gates, softmax and the loss are left out: they are not matmuls.
    """
    E, He, H = cfg.embed_size, cfg.encoder_hidden_size, cfg.hidden_size
    dirs = 2 if cfg.bidirectional else 1
    D = dirs * He
    encoder = sum(dirs * lstm_flops(E if layer == 0 else D, He) for layer in range(cfg.encoder_layers))
    per_src, per_step, per_pair = attention_flops(cfg, D)
    first_input = E + (H if cfg.input_feeding else 0) + (D if cfg.attention_query == "previous" else 0)
    decoder = lstm_flops(first_input, H) + (cfg.decoder_layers - 1) * lstm_flops(H, H)
    decoder += per_step + 2 * (D + H) * H + 2 * H * tgt_vocab
    bridge = 2 * 2 * D * H * cfg.decoder_layers if cfg.bridge == "bridge" else 0
    self_attention = cfg.self_attention_layers * (S * 8 * D * D + S * S * 4 * D)
    return S * (encoder + per_src) + self_attention + bridge + T * decoder + S * T * per_pair


def flops_report(
    cfg: ModelConfig,
    tgt_vocab: int,
    src_lengths: torch.Tensor,
    tgt_lengths: torch.Tensor,
    sentences_per_s: float | None,
    matmul_gflops: float,
    matmul_gflops_after: float | None = None,
) -> dict:
    """FLOPs per training sentence averaged over the training set; the achieved share of the matmul rate
    measured before training (fraction_of_matmul), after it (fraction_of_matmul_after, where measured) and the
    mean of the two fractions (fraction_of_matmul_mean)."""
    forward = float(forward_flops(cfg, tgt_vocab, src_lengths.double(), tgt_lengths.double()).mean())
    train = 3 * forward
    achieved = train * sentences_per_s / 1e9 if sentences_per_s else None
    before = achieved / matmul_gflops if achieved else None
    after = achieved / matmul_gflops_after if achieved and matmul_gflops_after else None
    mean_rate = (matmul_gflops + matmul_gflops_after) / 2 if matmul_gflops_after else matmul_gflops
    return {
        "mean_src_pieces": round(float(src_lengths.double().mean()), 3),
        "mean_tgt_pieces": round(float(tgt_lengths.double().mean()), 3),
        "forward_gflop_per_sentence": round(forward / 1e9, 4),
        "train_gflop_per_sentence": round(train / 1e9, 4),
        "achieved_gflops": round(achieved, 2) if achieved else None,
        "matmul_gflops": matmul_gflops,
        "matmul_gflops_after": matmul_gflops_after,
        "fraction_of_matmul": round(before, 4) if before else None,
        "fraction_of_matmul_after": round(after, 4) if after else None,
        "fraction_of_matmul_mean": round((before + after) / 2, 4) if before and after else None,
        "sentences_per_s_at_matmul_rate": round(mean_rate * 1e9 / train, 1),  # the mean of both rates, if two
    }


# ------------------------------------------------------------------------------------------- training
class Meter(TrainerHook):
    """Times the Trainer's optimizer steps and validations apart and counts what it trained on.

    The Trainer's budget (trainer.max_minutes) already counts the validations inside the loop, as the
    peers' TRAIN_SECONDS does; its final validation comes after the budget.
    """

    def __init__(self):
        self.step_seconds = self.valid_seconds = 0.0
        self.validations = self.sentences = self.target_tokens = 0

    def on_step(self, trainer: Trainer, seconds: float, sentences: int, tokens: int, skipped: bool) -> None:
        self.step_seconds += seconds
        if not skipped:
            self.sentences += sentences
            self.target_tokens += tokens

    def on_validation(self, trainer: Trainer, seconds: float) -> None:
        self.valid_seconds += seconds
        self.validations += 1


def train(
    cfg: DictConfig, run_dir: Path, device: str, hooks: Sequence[TrainerHook] = ()
) -> tuple[dict, Path, PreparedData]:
    """Train the composed config in this process (`hooks` observe it too); (measurements, last checkpoint,
    prepared data)."""
    start = time.perf_counter()
    data = load_data(cfg)
    prep_seconds = time.perf_counter() - start
    rss_after_prep = max_rss_gib()
    meter, windows = Meter(), Windows()
    trainer = build_run(cfg, run_dir, device, data, hooks=[meter, windows, *hooks])
    model, tcfg = trainer.module, trainer.cfg
    real, padded = padding_overhead(trainer.train_split, trainer.sampler.batches(0))
    log.info(
        "training %s parameters for %.0f s on %d thread(s)",
        f"{model.num_parameters():,}",
        60 * (tcfg.max_minutes or 0),
        torch.get_num_threads(),
    )
    start = time.perf_counter()
    summary = trainer.train()
    total_seconds = time.perf_counter() - start
    windows.close(trainer.step)  # the last, partial window
    train_seconds = trainer.elapsed  # the loop's wall clock (validations inside the budget included)
    steps_per_epoch = max(math.ceil(len(trainer.sampler) / tcfg.accumulate), 1)
    result = {
        "budget_seconds": round(60 * tcfg.max_minutes, 1) if tcfg.max_minutes else None,
        "data_prep_seconds": round(prep_seconds, 2),
        "total_seconds": round(total_seconds, 2),  # train() end to end, the final validation included
        "train_seconds": round(train_seconds, 2),
        "step_seconds": round(meter.step_seconds, 2),  # inside the optimizer steps only
        "valid_seconds": round(meter.valid_seconds, 2),
        "validations": meter.validations,
        "amp": trainer.amp,
        "bucketing": tcfg.bucketing,
        "batch_tokens": tcfg.batch_tokens,
        "steps": summary["step"],
        "epochs": round(trainer.epoch + trainer.batch_pos / steps_per_epoch, 3),
        "stopped_by": summary["stopped_by"],
        "sentences": meter.sentences,
        "target_tokens": meter.target_tokens,
        "sentences_per_s": round(meter.sentences / train_seconds, 2),
        "target_tokens_per_s": round(meter.target_tokens / train_seconds, 1),
        "sentences_per_s_steps_only": round(meter.sentences / max(meter.step_seconds, 1e-9), 2),
        "real_tokens_epoch0": real,
        "padded_tokens_epoch0": padded,
        "padding_overhead": round(padded / max(real, 1), 4),
        "peak_rss_gib": round(max_rss_gib(), 3),  # the whole process so far, data preparation included
        "rss_after_data_prep_gib": round(rss_after_prep, 3),
        "valid_bleu": (summary.get("final") or {}).get("bleu"),
        "checkpoint": summary["last_checkpoint"],
        "plan": summary["plan"],  # nmt.plan: {component: {implementation, reason}}
        # nmt.health: every 50 steps the rate, page faults and other runnable processes; the flags in words
        "windows": windows.records,
        "health": health(windows.records, torch.get_num_threads()),
        "fallbacks": summary["fallbacks"],
    }
    return result, Path(summary["last_checkpoint"]), data


# ------------------------------------------------------------------------------------------- decoding
def translate_command() -> list[str]:
    script = Path(sys.executable).parent / "nmt-translate"
    return [str(script)] if script.exists() else [sys.executable, "-m", "nmt.cli.translate"]


def decode_only(
    checkpoint: Path, sources: list[str], references: list[str], beam: int, device: str, amp: str = "auto"
) -> tuple[dict, list[str]]:
    """Translator.translate's seconds and BLEU in this process (amp: the decoding precision, as nmt-translate),
    after one sentence's warm-up, timed apart: the decoder step's C++ kernels are loaded then, or built where this
    machine has not built them yet (kernels; seconds, once per machine). The whole-process figure of
    `decode` includes everything."""
    translator = Translator.from_checkpoint(checkpoint, device, beam_size=beam, length_penalty=1.0, amp=amp)
    start = time.perf_counter()
    translator.translate(sources[:1])
    warmup = time.perf_counter() - start
    start = time.perf_counter()
    results = translator.translate(sources)
    seconds = time.perf_counter() - start
    hyps = [r[0].text for r in results]
    scores = corpus_scores(hyps, references, ter=False)
    return {
        "beam": beam,
        "sentences": len(sources),
        "precision": translator.settings["precision"],
        "precision_reason": translator.settings["precision_reason"],
        "kernels": translator.settings["kernels_resolved"],
        "plan": translator.settings["plan"],
        "warmup_seconds": round(warmup, 3),
        "decode_seconds": round(seconds, 3),
        "sentences_per_s": round(len(sources) / seconds, 2),
        "bleu": scores["bleu"],
        "chrf": scores["chrf"],
        "bleu_signature": scores["signatures"]["bleu"],
    }, hyps


def decode(
    checkpoint: Path, sources: list[str], references: list[str], beam: int, device: str, threads: int, work: Path
) -> dict:
    """Decode-only time in this process and whole-process time of nmt-translate, with BLEU of both outputs;
    then decode-only again in fp32 (amp=off) when the default precision is bf16, for comparison. This process
    takes nmt-translate's allocator settings first (nmt.memory.tune_for_decoding): training is over."""
    allocator = tune_for_decoding()
    result, hyps = decode_only(checkpoint, sources, references, beam, device)
    result["allocator"] = allocator
    (work / f"test_b{beam}.hyp").write_text("".join(h + "\n" for h in hyps), encoding="utf-8")

    src_file, out_file = work / "test.src", work / f"test_b{beam}.process.hyp"
    src_file.write_text("".join(s + "\n" for s in sources), encoding="utf-8")
    cmd = [
        *translate_command(),
        str(checkpoint),
        "--beam",
        str(beam),
        "--batch-size",
        str(len(sources)),
        "--device",
        device,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    start = time.perf_counter()
    with open(src_file, "rb") as fin, open(out_file, "wb") as fout:
        proc = subprocess.run(cmd, stdin=fin, stdout=fout, stderr=subprocess.PIPE, env=env)
    process_seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} failed ({proc.returncode}): {proc.stderr.decode()[-2000:]}")
    process_hyps = out_file.read_text(encoding="utf-8").splitlines()
    result.update(
        {
            "process_seconds": round(process_seconds, 3),
            "process_command": shlex.join(cmd),
            "process_bleu": corpus_scores(process_hyps, references, ter=False)["bleu"],
            "process_output_matches": process_hyps == hyps,
        }
    )
    if result["precision"] != "fp32":
        result["fp32"] = decode_only(checkpoint, sources, references, beam, device, amp="off")[0]
    return result


# ----------------------------------------------------------------------------------------------- peers
def gnu_time_seconds(text: str) -> float | None:
    """GNU time's elapsed wall clock, "[h:]mm:ss.ss", in seconds (None if unreadable)."""
    seconds = 0.0
    for part in text.split(":"):
        value = _number(part)
        if value is None:
            return None
        seconds = 60 * seconds + value
    return seconds


def peer_figures(name: str, summary: dict) -> dict:
    """The table's figures from a peer's summary JSON (the keys onmt_summary.py / joey_summary.py write)."""
    if name == "opennmt":
        params, tokens = summary.get("params"), summary.get("tgt_tok_per_s_overall")
        decode_key = "total_translation_secs"
    else:
        params = summary.get("params_ckpt") or summary.get("params_logged")
        tokens, decode_key = summary.get("trg_tok_per_s_overall"), "generation_secs"
    rss = (summary.get("train_maxrss_mb_wall") or [None])[0]  # MiB (GNU time's KiB / 1024)
    out = {
        "parameters": params,
        "sentences_per_s": summary.get("sent_per_s_overall"),
        "target_tokens_per_s": tokens,
        "peak_train_gib": round(rss / 1024, 3) if rss else None,
    }
    for label, beam in BEAMS.items():
        d = summary.get(f"decode_b{beam}") or {}
        times = d.get(decode_key) or []
        wall = (d.get("maxrss_mb_wall") or [None, None])[1]
        out[f"bleu_{label}"] = _number(d.get("bleu"))
        if name == "opennmt":  # onmt_translate appends to its -log_file: with a reused --work the last is ours
            times = times[-1:]
        out[f"decode_s_{label}"] = sum(float(t) for t in times) if times else None  # JoeyNMT: one per chunk
        out[f"process_s_{label}"] = gnu_time_seconds(wall) if isinstance(wall, str) else None
    return out


def _number(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def run_peer(name: str, peer_dir: Path, work: Path, data: Path, train_seconds: float, threads: int) -> dict:
    """Run <peer_dir>/<name>.sh; its summary and figures, or the failure and its log tail."""
    script, summary_name = PEERS[name]
    work.mkdir(parents=True, exist_ok=True)
    log_path = work / f"{name}_run.log"
    env = {
        **untuned_environment(),
        "WORK": str(work),
        "DATA": str(data),
        "THREADS": str(threads),
        "TRAIN_SECONDS": str(int(round(train_seconds))),
    }
    cmd = ["bash", str(peer_dir / script)]
    log.info("running %s (log: %s)", shlex.join(cmd), log_path)
    start = time.perf_counter()
    with open(log_path, "wb") as out:
        returncode = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
    result = {
        "command": shlex.join(cmd),
        "returncode": returncode,
        "log": str(log_path),
        "ok": False,
        "seconds": round(time.perf_counter() - start, 1),
    }
    try:
        summary = json.loads((work / summary_name).read_text())
        if returncode != 0:
            raise ValueError(f"exit status {returncode}")
        result.update(ok=True, summary=summary, figures=peer_figures(name, summary))
    except (OSError, ValueError) as e:
        tail = log_path.read_text(errors="replace").splitlines()[-40:]
        result.update(error=str(e), log_tail=tail)
        print(f"peer {name} failed ({e}); last lines of {log_path}:", *tail, sep="\n", file=sys.stderr)
    return result


# ---------------------------------------------------------------------------------------------- report
def our_figures(report: dict) -> dict:
    train, dec = report.get("train") or {}, report["decode"]
    out = {
        "parameters": report["model"]["parameters"],
        "sentences_per_s": train.get("sentences_per_s"),
        "target_tokens_per_s": train.get("target_tokens_per_s"),
        "peak_train_gib": train.get("peak_rss_gib"),
    }
    for label in BEAMS:
        out.update(
            {
                f"bleu_{label}": dec[label]["bleu"],
                f"decode_s_{label}": dec[label]["decode_seconds"],
                f"process_s_{label}": dec[label]["process_seconds"],
            }
        )
    return out


def floors(report: dict) -> list[dict]:
    """The project's targets against OpenNMT-py, with the figures they compare (reported, never asserted)."""
    ours = report["figures"]
    peer = (report["peers"].get("opennmt") or {}).get("figures")
    ref = peer or OPENNMT_README
    basis = "OpenNMT-py, this run" if peer else "OpenNMT-py, peers README"
    if peer and report.get("peers_note"):  # a peer's figures joined from another run (the report says which)
        basis = "OpenNMT-py, peers_note's run"

    def row(name: str, value, target, higher_is_better: bool, note: str) -> dict:
        met = None
        if value is not None and target is not None:
            met = value >= target if higher_is_better else value <= target
        return {"floor": name, "ours": value, "target": target, "met": met, "basis": note}

    sps, beam_s, greedy_s = (ref.get(k) for k in ("sentences_per_s", "decode_s_beam5", "decode_s_greedy"))
    fraction = (report.get("flops") or {}).get("fraction_of_matmul_mean")
    return [
        row(
            "training sentences/s >= 1.6 x OpenNMT-py",
            ours["sentences_per_s"],
            sps and round(1.6 * sps, 2),
            True,
            basis,
        ),
        row("training at >= 0.75 of the matmul rate (mean of before and after)", fraction, 0.75, True, "this run"),
        row(
            "beam-5 decode seconds (decode only) <= OpenNMT-py's / 1.6",
            ours["decode_s_beam5"],
            beam_s and round(beam_s / 1.6, 2),
            False,
            basis,
        ),
        row(
            "greedy decode seconds (decode only) <= OpenNMT-py's / 1.5",
            ours["decode_s_greedy"],
            greedy_s and round(greedy_s / 1.5, 2),
            False,
            basis,
        ),
        row(
            "test BLEU beam 5 >= 37.5",
            ours["bleu_beam5"],
            37.5,
            True,
            f"budget {report['args']['train_seconds']:.0f} s",
        ),
        row("peak training memory (GiB) <= 1.6", ours["peak_train_gib"], 1.6, False, "the target (glibc malloc)"),
    ]


def fmt(value, spec: str) -> str:
    if value is None:
        return "-"
    return format(value, spec)


TABLE_ROWS: list[tuple[str, str, str]] = [  # (label, figure key, format)
    ("parameters (M)", "parameters", ".2f"),
    ("training sentences/s (validation excluded)", "sentences_per_s", ".1f"),
    ("training target tokens/s", "target_tokens_per_s", ",.0f"),
    ("peak training memory (GiB)", "peak_train_gib", ".2f"),
    ("test BLEU greedy", "bleu_greedy", ".2f"),
    ("test BLEU beam 5", "bleu_beam5", ".2f"),
    ("decode greedy, decode only (s)", "decode_s_greedy", ".2f"),
    ("decode beam 5, decode only (s)", "decode_s_beam5", ".2f"),
    ("decode greedy, whole process (s)", "process_s_greedy", ".2f"),
    ("decode beam 5, whole process (s)", "process_s_beam5", ".2f"),
]


def machine_line(report: dict) -> str:
    """The CPU the figures come from, in one line; an emulation says so first and plainly."""
    m = report.get("machine") or {}
    flags = ", ".join(name for name, on in (m.get("cpu_flags") or {}).items() if on) or "flags not recorded"
    cpu = (
        f"{m.get('cpu_model', '?')} ({m.get('cpu_kind', 'kind not recorded')}: {flags}; torch's CPU capability "
        f"{m.get('cpu_capability', '?')}), {m.get('threads', '?')} thread(s), torch {m.get('torch', '?')}"
    )
    if report.get("emulated") == "avx2":
        variables = " ".join(f"{k}={v}" for k, v in AVX2_EMULATION.items())
        return (
            f"**EMULATED AVX2** ({variables}, trainer.amp=off) on {cpu}: an emulation, not a real AVX2 machine "
            "(this CPU's caches, clock and memory)"
        )
    return f"machine: {cpu}"


def format_table(report: dict) -> str:
    """Markdown: the machine (and an emulation, plainly), the side-by-side figures (ours, each peer, ours/peer),
    our own extras, then the floors."""
    peers = {n: p["figures"] for n, p in report["peers"].items() if p.get("ok")}
    scale: dict[str, Callable[[float], float]] = {"parameters": lambda v: v / 1e6}
    head = ["metric", "ours"] + [c for n in peers for c in (n, f"ours/{n}")]
    lines = [machine_line(report), ""]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, key, spec in TABLE_ROWS:
        conv = scale.get(key, lambda v: v)
        ours = report["figures"].get(key)
        cells = [label, fmt(conv(ours) if ours is not None else None, spec)]
        for figures in peers.values():
            theirs = figures.get(key)
            cells.append(fmt(conv(theirs) if theirs is not None else None, spec))
            cells.append(fmt(ours / theirs if ours is not None and theirs else None, ".2f"))
        lines.append("| " + " | ".join(cells) + " |")

    train, flops, mm = report.get("train") or {}, report["flops"], report["matmul"]
    mm16 = report.get("matmul_bf16") or {}
    mm_after, mm16_after = report.get("matmul_after") or {}, report.get("matmul_bf16_after") or {}
    extras = [
        (
            "training seconds (validation excluded) / validation seconds",
            f"{fmt(train.get('train_seconds'), '.1f')} / {fmt(train.get('valid_seconds'), '.1f')}",
        ),
        (
            "training precision (trainer.amp) / batches (trainer.bucketing, batch_tokens)",
            f"{train.get('amp', '-')} / {train.get('bucketing', '-')}, {train.get('batch_tokens', '-')}",
        ),
        ("padding overhead (padded / real tokens, epoch 0)", fmt(train.get("padding_overhead"), ".3f")),
        ("model GFLOP per training sentence (3 x forward)", fmt(flops["train_gflop_per_sentence"], ".3f")),
        ("achieved training GFLOP/s", fmt(flops["achieved_gflops"], ".1f")),
        (
            f"torch.mm {mm['n']}^3 fp32 / bf16 GFLOP/s, {mm['threads']} thread(s), before training",
            f"{fmt(mm['gflops'], '.1f')} / {fmt(mm16.get('gflops'), '.1f')}",
        ),
        (
            "torch.mm fp32 / bf16 GFLOP/s right after training",
            f"{fmt(mm_after.get('gflops'), '.1f')} / {fmt(mm16_after.get('gflops'), '.1f')}",
        ),
        (
            f"achieved fraction of the matmul rate ({flops.get('matmul_dtype', 'float32')}): "
            "before / after training, mean",
            f"{fmt(flops['fraction_of_matmul'], '.3f')} / {fmt(flops.get('fraction_of_matmul_after'), '.3f')}, "
            f"{fmt(flops.get('fraction_of_matmul_mean'), '.3f')}",
        ),
        ("sentences/s at the matmul rate", fmt(flops["sentences_per_s_at_matmul_rate"], ".1f")),
    ]
    for label in BEAMS:
        dec = report["decode"][label]
        if "fp32" in dec:  # the default precision was bf16: the same decode in fp32 beside it
            extras.append(
                (
                    f"decode {label}, decode only: seconds / BLEU in {dec['precision']} and in fp32",
                    f"{fmt(dec['decode_seconds'], '.2f')} / {fmt(dec['bleu'], '.2f')} and "
                    f"{fmt(dec['fp32']['decode_seconds'], '.2f')} / {fmt(dec['fp32']['bleu'], '.2f')}",
                )
            )
    h = train.get("health") or {}
    if h.get("windows"):
        lowest, median, spread = h.get("lowest_over_median"), h.get("median_target_tokens_per_s"), h.get("spread")
        extras.append(
            (
                "50-step windows: lowest over median, median target tokens/s (spread); flags",
                f"{fmt(lowest, '.2f')}, {fmt(median, ',.0f')} ({fmt(spread, '.0%')}); "
                + ("; ".join(h["flags"]) or "none"),
            )
        )
    lines += ["", "| ours | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in extras]
    lines += ["", "| floor (reported, not asserted) | ours | target | met | basis |", "|---|---|---|---|---|"]
    for f in report["floors"]:
        met = {True: "yes", False: "no", None: "-"}[f["met"]]
        cells = [f["floor"], fmt(f["ours"], ".2f"), fmt(f["target"], ".2f"), met, f["basis"]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def model_and_flops(checkpoint: Path, corpus, data: PreparedData | None, report: dict) -> tuple[dict, dict]:
    """The checkpoint's model (size, config) and its FLOPs per training sentence.

    The mean lengths come from the encoded training split when we trained, else from the corpus's training
    sentences under the checkpoint's own tokenizer.
    """
    translator = Translator.from_checkpoint(checkpoint, "cpu")
    model, tokenizer = translator.model, translator.tokenizer
    if data is not None:
        src_lengths, tgt_lengths = data.encoded["train"].src_lengths, data.encoded["train"].tgt_lengths
    else:
        pairs = corpus.splits["train"]
        src_lengths = torch.tensor([len(x) for x in tokenizer.encode_src([s for s, _ in pairs])])
        tgt_lengths = torch.tensor([len(x) for x in tokenizer.encode_tgt([t for _, t in pairs])])
    info = {
        "parameters": model.num_parameters(),
        "src_vocab": model.src_vocab,
        "tgt_vocab": model.tgt_vocab,
        "config": model.config.to_dict(),
    }
    sentences_per_s = (report["train"] or {}).get("sentences_per_s")
    bf16 = (report["train"] or {}).get("amp") == "bf16" and report.get("matmul_bf16")
    rate = report["matmul_bf16"] if bf16 else report["matmul"]  # the precision training ran its matmuls in
    after = report.get("matmul_bf16_after" if bf16 else "matmul_after") or {}
    flops = flops_report(
        model.config, model.tgt_vocab, src_lengths, tgt_lengths, sentences_per_s, rate["gflops"], after.get("gflops")
    )
    flops["matmul_dtype"] = rate["dtype"]
    return info, flops


def write_json(report: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


# ------------------------------------------------------------------------------------------------ main
def retable(path: Path, out: Path | None) -> int:
    """--table: the table of an earlier report, with peer figures and floors recomputed from its raw data."""
    report = json.loads(path.read_text(encoding="utf-8"))
    for name, peer in report["peers"].items():
        if peer.get("ok"):
            peer["figures"] = peer_figures(name, peer["summary"])
    report["floors"] = floors(report)
    if out is not None:
        write_json(report, out)
    print(format_table(report))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.table:
        return retable(Path(args.table), Path(args.out) if args.out else None)
    if args.emulate_avx2:
        emulate_avx2()  # this process again, with AVX2_EMULATION in its environment (returns in that one)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    work = Path(args.work or tempfile.mkdtemp(prefix="nmt-benchmark-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    out = Path(args.out or "benchmark.json")
    cfg, overrides = benchmark_config(args, work)
    torch.set_num_threads(args.threads)
    device = resolve_device(cfg.device)
    report: dict = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "args": vars(args),
        "overrides": overrides,
        "work": str(work),
        "emulated": emulated(),  # "avx2": --emulate-avx2 (nmt.cpu.AVX2_EMULATION), not a real AVX2 machine
        "machine": describe_machine(args.threads),
        "device": device,
        "allocator": tune_allocator(),  # nmt/memory.py's settings (empty: none applied)
    }
    # the yardstick on the device that trains: a GPU's own rate (4096^3, where 512^3 leaves it mostly idle)
    mm = {"n": 4096, "device": device} if torch.device(device).type == "cuda" else {}
    log.info("matmul rate: %.1f s of %d^3 torch.mm on %s", args.matmul_seconds, mm.get("n", 512), device)
    report["matmul"] = matmul_rate(args.threads, args.matmul_seconds, **mm)
    report["matmul_bf16"] = matmul_rate(args.threads, args.matmul_seconds, dtype=torch.bfloat16, **mm)

    data = None
    if args.skip_train:
        checkpoint, report["train"] = Path(args.skip_train), None
        corpus = build_corpus(cfg.data, cfg.paths.data_dir)
    else:
        report["train"], checkpoint, data = train(cfg, work / "run", device)
        corpus = data.corpus
        log.info("matmul rate again, right after training")
        report["matmul_after"] = matmul_rate(args.threads, args.matmul_seconds, **mm)
        if report["train"]["amp"] == "bf16":
            report["matmul_bf16_after"] = matmul_rate(args.threads, args.matmul_seconds, dtype=torch.bfloat16, **mm)
    pairs = corpus.splits[TEST_SPLIT]
    sources, references = [s for s, _ in pairs], [t for _, t in pairs]
    report["decode"] = {"split": TEST_SPLIT, "corpus": corpus.name, "checkpoint": str(checkpoint)}
    for label, beam in BEAMS.items():
        log.info("decoding %d %s sentences, beam %d", len(sources), TEST_SPLIT, beam)
        report["decode"][label] = decode(checkpoint, sources, references, beam, device, args.threads, work)
    report["decode_children_peak_rss_gib"] = round(max_rss_gib(resource.RUSAGE_CHILDREN), 3)

    report["model"], report["flops"] = model_and_flops(checkpoint, corpus, data, report)
    report["peak_rss_gib"] = round(max_rss_gib(), 3)
    report["figures"] = our_figures(report)
    report["peers"] = {}
    report["floors"] = floors(report)
    write_json(report, out)  # ours are safe even if a peer run hangs or is interrupted

    for name in dict.fromkeys(args.peer):
        report["peers"][name] = run_peer(
            name,
            Path(args.peer_dir).resolve(),
            work / "peer",
            Path(args.data).resolve(),
            args.train_seconds,
            args.threads,
        )
    report["floors"] = floors(report)
    write_json(report, out)
    print(format_table(report))
    print(f"\nJSON: {out}")
    return 0


if __name__ == "__main__":
    with user_errors():  # a missing corpus or a bad override: one line, not a traceback
        sys.exit(main())
