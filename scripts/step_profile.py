"""python scripts/step_profile.py [--steps 20] [--threads 2] [--data DIR] [--ops N] [--emulate-avx2] [--out F] [-- K=V]

Where a training step's time goes, phase by phase, on the batches nmt-train would train on:

    python scripts/step_profile.py                                   # the multi30k_deen preset
    python scripts/step_profile.py --data '' -- experiment=bottleneck_bible hydra.mode=RUN attention=bahdanau \
        data.window=4                                                # the study's RNNsearch on verse windows
    python scripts/step_profile.py --min-source 100 --data '' -- experiment=bottleneck_bible hydra.mode=RUN \
        attention=bahdanau data.window=4                             # its long windows only (100+ pieces)
    python scripts/step_profile.py --emulate-avx2 --ops 25           # fp32 with torch kept to AVX2

Each of --steps batches (after 3 warm-up batches) is timed five ways, each forward and backward:
    step         the whole optimizer step, as the Trainer takes it (forward, loss, backward, clip, Adam)
    encoder      Seq2Seq.encode alone (embeddings, biLSTM, the attention's keys, the bridge)
    attention    the attention module alone, called as the decoder calls it (once per target step, keys and
                 values through `for_steps`, when the query is the previous state or input feeding is on;
                 once for all steps otherwise)
    output+loss  the output layer over the scored target positions and the label-smoothed loss
    optimizer    gradient clipping and the Adam step (timed inside `step`)
and the decoder recurrence is the rest: step - encoder - output+loss - optimizer, of which the attention's
share is reported apart ("recurrence without attention" = LSTM steps, W_c, dropout, concatenations). Phases
timed alone do not share caches with the rest of the step; the recurrence, a remainder, absorbs that
difference (so the parts sum to the whole by construction). Matmul FLOPs per phase come from torch's FLOP
counter (forward and backward; taught oneDNN's LSTM layer, which it otherwise counts as 0: `count_lstm_flops`),
and each phase's GFLOP/s is set against this machine's measured fp32 torch.mm rate (512^3).
With --ops N, each timed batch's step runs once more under torch.profiler, and the
N operators with the most time of their own (not counting the operators they call) are listed, with their calls and
microseconds a target token: what a phase's time is made of (the profiler adds its own cost to each call).
Runs in fp32 (trainer.amp=off: on CPUs without bf16 hardware that is how nmt-train runs) unless an override
sets trainer.amp; the "of mm" column is against the fp32 rate either way. --min-source N profiles the
training examples whose source has N pieces or more only, batched as scripts/step_benchmark.py does.
--emulate-avx2 starts the script again with torch's ATen kernels, oneDNN and MKL kept to AVX2
(nmt.cpu.AVX2_EMULATION; trainer.amp=off after every override): the fp32 path as on an AVX2-only CPU, on
this one. It is not an AVX2 machine (this CPU's caches, clock and memory stay); the output's first line and the
JSON (`emulated: avx2`) say so.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import nmt.cli  # noqa: F401  (sets the CPU memory settings of nmt/memory.py: must come before torch)

# isort: split
import torch
from step_benchmark import long_examples  # this script's neighbour (scripts/ is on the path when run)
from torch.utils.flop_counter import FlopCounterMode

from nmt.cli.common import build_run, compose_config, user_errors
from nmt.cpu import AVX2_EMULATION, emulate_avx2, emulated
from nmt.data import collate
from nmt.decoder import active_rows, first_rows
from nmt.loss import loss_rows, output_loss_sum, token_loss
from nmt.matmul_rate import matmul_rate
from nmt.provenance import describe_machine
from nmt.special import PAD_ID

WARMUP = 3
PHASES = ("encoder", "recurrence without attention", "attention", "output+loss", "optimizer")


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    argv = sys.argv[1:] if argv is None else argv
    overrides = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[1], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=20, help="timed batches (default 20)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    p.add_argument("--data", default="../shared/data/multi30k", help="Multi30k raw files; '' for another corpus")
    p.add_argument("--ops", type=int, default=0, help="also list the N operators with the most self time (default 0)")
    p.add_argument("--out", help="also write the results as JSON to this file")
    p.add_argument(
        "--min-source", type=int, default=0, metavar="N", help="only examples whose source has N+ pieces (default: all)"
    )
    p.add_argument(
        "--matmul-seconds", type=float, default=3.0, help="length of the matmul rate's measurement (default 3)"
    )
    p.add_argument(
        "--emulate-avx2",
        action="store_true",
        help="run again with ATen, oneDNN and MKL kept to AVX2 and trainer.amp=off (an emulation, not an AVX2 CPU)",
    )
    args = p.parse_args(argv)
    if args.steps < 1 or args.threads < 1 or args.min_source < 0 or args.matmul_seconds <= 0:
        p.error("--steps, --threads and --matmul-seconds must be positive (--min-source 0 or more)")
    if args.ops < 0:
        p.error("--ops must be 0 (no operator list) or more")
    return args, overrides


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


class Phases:
    """The phases of one batch as closures over the model, each running forward and backward."""

    def __init__(self, trainer, batch):
        self.model, self.trainer, self.batch = trainer.module, trainer, batch
        decoder = self.model.decoder
        with torch.no_grad():  # inputs of the phases timed alone (their values do not change the cost)
            enc, keys, values, state = self.model.encode(batch.src, batch.src_lengths)
        captured = {}
        hook = decoder.output.register_forward_pre_hook(lambda _m, args: captured.update(h=args[0]))
        self.rows = loss_rows(batch.tgt_out)  # the target positions scored, as the Trainer does
        self.target = batch.tgt_out.reshape(-1)[self.rows]  # (N,)
        self.tokens = int((self.target != PAD_ID).sum())
        with torch.no_grad():
            self.model(batch.src, batch.src_lengths, batch.tgt_in, self.rows)
        hook.remove()
        self.decoder_out = captured["h"].detach()  # (N, H): what the output layer reads
        self.keys, self.values, self.mask = keys.detach(), values.detach(), enc.mask
        B, T = batch.tgt_in.shape
        stepwise = decoder.query == "previous" or decoder.input_feeding
        shape = (B, 1, decoder.hidden_size) if stepwise else (B, T, decoder.hidden_size)
        self.queries = [torch.randn(shape) for _ in range(T if stepwise else 1)]
        self.active = active_rows(batch.tgt_in) if stepwise else [B]  # the loop's rows at each step

    def step(self) -> float:
        """The Trainer's step; returns the optimizer's part of its time."""
        t, model, b = self.trainer, self.model, self.batch
        t.optimizer.zero_grad(set_to_none=True)
        (t.batch_loss(b, self.rows) / self.tokens).backward()  # the Trainer's forward and loss
        return timed(lambda: (torch.nn.utils.clip_grad_norm_(model.parameters(), t.cfg.clip_norm), t.optimizer.step()))

    def encoder(self) -> None:
        enc, keys, values, state = self.model.encode(self.batch.src, self.batch.src_lengths)
        (keys.sum() + values.sum() + state.h.sum() + state.c.sum()).backward()

    def attention(self) -> None:
        keys, values, mask = self.keys.clone().requires_grad_(), self.values.clone().requires_grad_(), self.mask
        if len(self.queries) > 1:  # once per step, as the decoder's loop calls it (its rows: active_rows)
            keys, values = self.model.attention.for_steps(keys, values, None)
        total = 0
        for q, n in zip(self.queries, self.active, strict=True):
            if n < mask.size(0):
                keys, values, mask = first_rows(keys, n), first_rows(values, n), mask[:n]
            context, _ = self.model.attention(q[:n].requires_grad_(), keys, values, mask)
            total = total + context.sum()
        total.backward()

    def output_loss(self) -> None:
        h, output, eps = (
            self.decoder_out.clone().requires_grad_(),
            self.model.decoder.output,
            self.trainer.cfg.label_smoothing,
        )
        if self.trainer.output_in_loss:  # as the Trainer computes it (fp32 on a CPU: the layer inside the loss)
            loss = output_loss_sum(h, output, self.target, eps)
        else:
            loss = token_loss(output(h), self.target, eps)[0]
        (loss / self.tokens).backward()


def operators(steps: list[Phases], tokens: int, top: int) -> tuple[float, list[dict]]:
    """One more run of each batch's step under torch.profiler: (seconds of every operator's self CPU time,
    the `top` operators by self CPU time)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for phases in steps:
            phases.step()
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events)  # microseconds
    return total / 1e6, [
        {
            "name": e.key,
            "calls": e.count,
            "self_seconds": round(e.self_cpu_time_total / 1e6, 6),
            "share": round(e.self_cpu_time_total / total, 4),
            "us_per_target_token": round(e.self_cpu_time_total / tokens, 2),
        }
        for e in events[:top]
    ]


def _lstm_layer_flops(x_shape, w_ih_shape, w_hh_shape) -> int:
    """One direction of an LSTM layer over x (B, S, in) or (S, B, in): 4H x (in + H) multiply-adds a token."""
    tokens = math.prod(x_shape[:-1])
    return 2 * tokens * (math.prod(w_ih_shape) + math.prod(w_hh_shape))


def count_lstm_flops() -> None:
    """Teach torch's FLOP counter oneDNN's LSTM layer (nn.LSTM on a CPU runs aten::mkldnn_rnn_layer, which it has
    no formula for, and counted as 0: the encoder's matmuls were missing from its phase and from the step).
    Forward: the gate matmuls W_ih x and W_hh h of every token; backward: twice that (input and weight grads)."""
    from torch.utils.flop_counter import register_flop_formula

    def forward(x, w_ih, w_hh, *args, out_shape=None, **kwargs) -> int:
        return _lstm_layer_flops(x, w_ih, w_hh)

    def backward(x, w_ih, w_hh, *args, out_shape=None, **kwargs) -> int:
        return 2 * _lstm_layer_flops(x, w_ih, w_hh)

    for op, formula in (
        (torch.ops.aten.mkldnn_rnn_layer, forward),
        (torch.ops.aten.mkldnn_rnn_layer_backward, backward),
    ):
        try:
            register_flop_formula(op)(formula)
        except (RuntimeError, ValueError, AttributeError):  # a torch that counts it already, or has no such op
            pass


def flops(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def main(argv: list[str] | None = None) -> int:
    args, overrides = parse_args(argv)
    if args.emulate_avx2:
        emulate_avx2()  # this process again, with AVX2_EMULATION in its environment (returns in that one)
        overrides = [*overrides, "trainer.amp=off"]
        variables = " ".join(f"{k}={v}" for k, v in AVX2_EMULATION.items())
        print(f"EMULATED AVX2 ({variables}, trainer.amp=off): an emulation on this CPU, not a real AVX2 machine")
    torch.set_num_threads(args.threads)
    count_lstm_flops()
    root = [f"data.root={Path(args.data).resolve()}"] if args.data else []
    fixed = ["trainer.progress=false", "trainer.amp=off", f"trainer.threads={args.threads}"]  # not auto's count
    cfg = compose_config(["experiment=multi30k_deen", *root, *fixed, *overrides])
    trainer = build_run(cfg, Path(tempfile.mkdtemp(prefix="nmt-profile-")), "cpu")
    trainer.module.train()
    split, sampler = trainer.train_split, trainer.sampler
    if args.min_source:
        split, sampler = long_examples(split, sampler, args.min_source)
    batches = sampler.batches(0)[: WARMUP + args.steps]
    if len(batches) <= WARMUP:
        raise SystemExit(f"epoch 0 has {len(batches)} batches, no more than the {WARMUP} warm-up ones: nothing to time")
    seconds = dict.fromkeys(("step", "encoder", "attention", "output+loss", "optimizer"), 0.0)
    counted = dict.fromkeys(("step", "encoder", "attention", "output+loss"), 0)
    sentences = tokens = 0
    profiled: list[Phases] = []  # the timed batches, for --ops
    for i, indices in enumerate(batches):
        batch = collate(split, indices)
        phases = Phases(trainer, batch)
        runs = {"encoder": phases.encoder, "attention": phases.attention, "output+loss": phases.output_loss}
        if i < WARMUP:
            phases.step(), [fn() for fn in runs.values()]
            continue
        optimizer_seconds = [0.0]
        seconds["step"] += timed(lambda p=phases, o=optimizer_seconds: o.__setitem__(0, p.step()))
        seconds["optimizer"] += optimizer_seconds[0]
        for name, fn in runs.items():
            seconds[name] += timed(fn)
        counted["step"] += flops(phases.step)  # matmul FLOPs, counted in an untimed second run of each phase
        for name, fn in runs.items():
            counted[name] += flops(fn)
        sentences, tokens = sentences + len(indices), tokens + batch.n_tokens
        if args.ops > 0:
            profiled.append(phases)
    profiled_seconds, ops = operators(profiled, tokens, args.ops) if args.ops > 0 else (0.0, [])
    trainer.optimizer.zero_grad(set_to_none=True)
    rate = matmul_rate(args.threads, args.matmul_seconds)["gflops"]
    recurrence = seconds["step"] - seconds["encoder"] - seconds["output+loss"] - seconds["optimizer"]
    parts = {
        "encoder": seconds["encoder"],
        "recurrence without attention": recurrence - seconds["attention"],
        "attention": seconds["attention"],
        "output+loss": seconds["output+loss"],
        "optimizer": seconds["optimizer"],
    }
    phase_flops = {
        "encoder": counted["encoder"],
        "recurrence without attention": counted["step"]
        - counted["encoder"]
        - counted["attention"]
        - counted["output+loss"],
        "attention": counted["attention"],
        "output+loss": counted["output+loss"],
        "optimizer": 0,
    }
    rows = {}
    for name in PHASES:
        gflops = phase_flops[name] / max(parts[name], 1e-9) / 1e9
        rows[name] = {
            "seconds": round(parts[name], 3),
            "share": round(parts[name] / seconds["step"], 3),
            "gflop": round(phase_flops[name] / 1e9, 2),
            "gflops_per_s": round(gflops, 1),
            "fraction_of_matmul_rate": round(gflops / rate, 3),
        }
    model, machine = trainer.module.config, describe_machine(args.threads)
    flags = ", ".join(name for name, on in machine["cpu_flags"].items() if on) or "none of avx2/avx512/amx"
    print(
        f"machine: {machine['cpu_model']} ({machine['cpu_kind']}: {flags}; torch's CPU capability "
        f"{machine['cpu_capability']}), malloc {machine['malloc']}"
    )
    print(
        f"{len(batches) - WARMUP} batches, {sentences} sentences, {tokens} target tokens, "
        f"{tokens / seconds['step']:.0f} target tokens/s; {model.attention} (query {model.attention_query}, "
        f"input feeding {model.input_feeding}); fp32 torch.mm {rate} GFLOP/s on {args.threads} thread(s)"
    )
    print(f"{'phase':30s} {'seconds':>8s} {'share':>6s} {'GFLOP':>7s} {'GFLOP/s':>8s} {'of mm':>6s}")
    for name, r in rows.items():
        print(
            f"{name:30s} {r['seconds']:8.2f} {r['share']:6.1%} {r['gflop']:7.1f} {r['gflops_per_s']:8.1f} "
            f"{r['fraction_of_matmul_rate']:6.1%}"
        )
    print(f"{'whole step':30s} {seconds['step']:8.2f} {1:6.1%} {counted['step'] / 1e9:7.1f}")
    if ops:
        print(
            f"\nprofiled: {profiled_seconds:.2f} s of operator self time, "
            f"{profiled_seconds / tokens * 1e6:.0f} us a target token"
        )
        print(
            f"\n{'operator (self time, one more run of each step, profiled)':60s} {'calls':>7s} {'seconds':>8s} "
            f"{'share':>6s} {'us/token':>8s}"
        )
        for op in ops:
            print(
                f"{op['name'][:60]:60s} {op['calls']:7d} {op['self_seconds']:8.3f} {op['share']:6.1%} "
                f"{op['us_per_target_token']:8.2f}"
            )
    if args.out:
        report = {
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "overrides": overrides,
            "threads": args.threads,
            "emulated": emulated(),  # "avx2": --emulate-avx2, not a real AVX2 machine
            "machine": machine,
            "matmul_fp32_gflops": rate,
            "min_source": args.min_source,
            "batches": len(batches) - WARMUP,
            "sentences": sentences,
            "target_tokens": tokens,
            "step_seconds": round(seconds["step"], 3),
            "target_tokens_per_s": round(tokens / seconds["step"], 1),
            "step_gflop": round(counted["step"] / 1e9, 2),
            "phases": rows,
            "profiled_seconds": round(profiled_seconds, 3),
            "operators": ops,
        }
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    with user_errors():  # a missing corpus or a bad override: one line, not a traceback
        sys.exit(main())
