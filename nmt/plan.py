"""One plan per run: which implementation computes each part of a step, and why, chosen in one place.

Before its first step a run (the Trainer; a Translator for decoding) resolves one implementation for every
component below from the device, the precision, the thread count, the model's shape and the one user setting
`kernels` (auto | eager; `compiled` insists, for tests and benchmarks), logs the plan as a table and records it
({component: {implementation, reason}}) in metrics.json, in every checkpoint's provenance and in benchmark JSONs.

    plan = choose(Inputs(device="cpu", bf16=False, kernels="auto", threads=2, ...), shape_of(model))
    plan.apply()            # its kernels on for this process (nmt.kernels.compiled), glibc's malloc tuned
    plan.log()              # the table, one line a component
    plan.record()           # {component: {implementation, reason}}

The kernels (nmt/kernels/csrc, and torch.compile's energy) are switched per component: `kernels_off` turns
single components back to their torch form (scripts/kernel_ablation.py measures each one so). A kernel that the
plan chose but that does not apply to a call (a dtype, a layout, a dispatch mode) takes the torch form for that
call, logged once with why (nmt.kernels.compiled.fallback).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from nmt.choices import Kernels, choice
from nmt.device_plan import choose_plan
from nmt.errors import ConfigError
from nmt.kernels import compiled
from nmt.kernels.compiled import use_kernels
from nmt.memory import tune_for_fp32_training
from nmt.precision import native_bf16

log = logging.getLogger(__name__)

# the components whose implementation is a kernel (nmt.kernels.compiled.KERNELS: what `kernels_off` may name)
KERNEL_COMPONENTS = (
    "encoder",
    "decoder_step",
    "step_products",
    "attention_energy",
    "output_loss",
    "dropout_mask",
    "beam_topk",
)
COMPONENTS = ("precision", "threads", "allocator", "work_sizes", *KERNEL_COMPONENTS)


@dataclass(frozen=True)
class Shape:
    """What of the model decides a component: the attention's score, the decoder's loop and the encoder's LSTM."""

    additive: bool = True  # the attention scores with the additive energy v^T tanh(q + k)
    input_feeding: bool = True
    query_previous: bool = False  # Bahdanau's order: the previous state queries
    decoder_layers: int = 1
    bidirectional: bool = True
    encoder_layers: int = 1


def shape_of(model) -> Shape:
    """The Shape of a Seq2Seq (duck-typed: its config and its decoder's attention)."""
    c = model.config
    return Shape(
        additive=model.decoder.attention.additive_v() is not None,
        input_feeding=bool(c.input_feeding),
        query_previous=str(c.attention_query) == "previous",
        decoder_layers=c.decoder_layers,
        bidirectional=bool(c.bidirectional),
        encoder_layers=c.encoder_layers,
    )


@dataclass(frozen=True)
class Inputs:
    device: str  # "cpu", "cuda"
    bf16: bool
    bf16_why: str
    kernels: Kernels | str = Kernels.auto
    threads: int = 1
    threads_why: str = ""
    purpose: str = "train"  # train | decode (a search: no torch.compile, no loss, no malloc tuning)
    kernels_off: tuple[str, ...] = ()


@dataclass
class Plan:
    parts: dict[str, dict[str, str]]  # component -> {implementation, reason}
    kernels: frozenset[str]  # the kernel components on
    strict: bool  # kernels=compiled: a kernel that fails to build is an error
    tune_malloc: bool = False
    malloc: dict = field(default_factory=dict)  # what tune_for_fp32_training set

    def put(self, component: str, implementation: str, reason: str) -> None:
        self.parts[component] = {"implementation": implementation, "reason": reason}

    def record(self) -> dict[str, dict[str, str]]:
        return {k: dict(v) for k, v in self.parts.items()}

    def apply(self) -> None:
        """Turn this plan's kernels on for the process (and glibc's malloc thresholds, where it says so)."""
        use_kernels(self.kernels, self.strict)
        if self.tune_malloc:
            self.malloc = tune_for_fp32_training() or {}
            if self.malloc:
                sizes = (
                    f"{k.removeprefix('fp32 training: malloc ')} {int(v) >> 20} MiB" for k, v in self.malloc.items()
                )
                self.parts["allocator"]["implementation"] += f" ({', '.join(sizes)})"

    def table(self) -> list[str]:
        width = max(map(len, self.parts))
        return [f"  {k:<{width}}  {v['implementation']}: {v['reason']}" for k, v in self.parts.items()]

    def log(self) -> None:
        log.info("plan:\n%s", "\n".join(self.table()))

    def on(self, component: str) -> bool:
        return component in self.kernels


def check_off(names) -> tuple[str, ...]:
    """kernels_off as a tuple of kernel components, or a ConfigError naming them."""
    names = tuple(names or ())
    unknown = [n for n in names if n not in KERNEL_COMPONENTS]
    if unknown:
        raise ConfigError(
            f"kernels_off={list(names)}: {', '.join(unknown)} is no kernel; use some of {', '.join(KERNEL_COMPONENTS)}"
        )
    return names


def choose(i: Inputs, shape: Shape = Shape()) -> Plan:
    """The plan for `i` and `shape` (see the module docstring)."""
    setting = choice(Kernels, i.kernels, "kernels")
    off = check_off(i.kernels_off)
    cpu, fp32, train = i.device == "cpu", not i.bf16, i.purpose == "train"
    found = compiled.compiler() if cpu and compiled.has_compiler() else None
    parts: dict[str, dict[str, str]] = {}

    def put(component: str, implementation: str, reason: str) -> None:
        parts[component] = {"implementation": implementation, "reason": reason}

    put("precision", "bf16 autocast" if i.bf16 else "fp32", i.bf16_why)
    put("threads", str(i.threads), i.threads_why or "torch's count")
    tune = cpu and fp32 and train
    if tune:
        put(
            "allocator",
            "glibc malloc thresholds raised",
            "fp32 CPU training: the step's large tensors stay in the heap's reuse instead of fresh mmaps (nmt.memory)",
        )
    else:
        put(
            "allocator",
            "the allocator's defaults",
            "the malloc tuning is for fp32 CPU training" if train else "decoding",
        )
    if train:
        kind, how = choose_plan(i.device)[1].split(": ", 1)
        put("work_sizes", f"the {kind} plan", how)
    else:
        put("work_sizes", "a search batch at a time", "decoding.batch_tokens (nmt.decoding)")
    # the kernels: where each could run, and whether the setting lets it
    if setting == Kernels.eager:
        gate = "kernels=eager"
    elif not cpu:
        gate = f"the kernels are CPU code, this is {i.device}"
    elif found is None and setting == Kernels.auto:
        gate = "no C++ compiler on PATH (CXX, c++, g++, clang++; apt install g++)"
    else:
        gate = ""
    isa = torch.backends.cpu.get_cpu_capability() if cpu else ""
    built = f"C++ built for {isa} by {found or 'a C++ compiler'}"
    on: set[str] = set()

    def kernel(component: str, implementation: str, reason: str, applies: str | None, torch_form: str) -> None:
        """The kernel where it applies and the setting lets it, else `torch_form` with why not."""
        why_not = gate or ("kernels_off" if component in off else "") or (applies or "")
        if why_not:
            put(component, torch_form, why_not)
        else:
            on.add(component)
            put(component, implementation, reason)

    two = {
        1: "both directions one after the other on one thread, measured faster than nn.LSTM's there",
        2: "both directions at once, a thread each, measured faster than nn.LSTM's two threads",
    }.get(
        i.threads,
        f"both directions at once on two of {i.threads} threads (unmeasured above 2 threads)",
    )
    kernel(
        "encoder",
        "encoder_lstm.cpp",
        f"{two}; W_hh packed once a batch ({built})",
        None
        if fp32 and shape.bidirectional and shape.encoder_layers == 1
        else "the kernel takes one bidirectional fp32 layer",
        "nn.LSTM (oneDNN)" if cpu else "nn.LSTM",
    )
    if not train:
        loop, applies = (
            "additive_step.cpp and lstm_cell.cpp a search step",
            None if fp32 else ("bf16 decoding: the search's kernels were measured in fp32 only (docs/performance.md)"),
        )
    elif shape.decoder_layers != 1:
        loop, applies = "lstm_cell.cpp", None
    elif shape.additive and shape.input_feeding and not shape.query_previous and fp32 and "step_products" not in off:
        loop, applies = "feed_loop.cpp: the input-feeding loop as one autograd node", None
    elif shape.additive and shape.query_previous and not shape.input_feeding:
        loop, applies = "decoder_loop: RNNsearch's loop as one autograd node (additive_step.cpp, lstm_cell.cpp)", None
    else:
        loop, applies = "lstm_cell.cpp" + (" and additive_step.cpp" if shape.additive else "") + " each step", None
    kernel(
        "decoder_step", loop, f"fewer operators and passes a step ({built})", applies, "torch operations, a node each"
    )
    if not train:
        products, applies = "", "a search multiplies each weight once a step, unpacked"
    elif fp32:
        products, applies = "step_gemm.cpp panels", None
    elif native_bf16("cpu") if cpu else False:
        products, applies = "oneDNN's packed bf16 layout (Packed)", None
    else:
        products, applies = "", "bf16 weights are packed only on a CPU with bf16 hardware"
    kernel("step_products", products, f"a step's weight packed once a batch, not at every product ({built})",
           applies, "F.linear and mm")  # fmt: skip
    kernel(
        "attention_energy",
        "torch.compile (Inductor)",
        f"the energy's passes in one loop; Inductor vectorises for {isa}",
        None
        if shape.additive and train
        else ("no additive energy" if train else "a search compiles nothing: it starts in a second"),
        "torch operations in cache-sized pieces" if shape.additive else "not used",
    )
    if cpu and fp32 and train:
        xent = f"the logits never whole, three passes a piece ({built})"
        kernel(
            "output_loss",
            "output layer in the loss, smoothed_xent.cpp",
            xent,
            None,
            "output layer in the loss, torch operations",
        )
    else:
        form = "logits, then the loss in one call" if not cpu else "logits, then the loss in pieces"
        put(
            "output_loss",
            form if train else "not used (decoding)",
            "bf16 or a GPU: the output layer's matmul stays whole" if train else "decoding",
        )
    if not train:
        put("dropout_mask", "not used", "decoding drops nothing")
    elif cpu:
        kernel("dropout_mask", "keep_mask.cpp", f"three 16-bit uniforms a draw, one pass ({built})",
               None if fp32 else "the C++ mask is fp32", "three 16-bit uniforms a draw, torch operations")  # fmt: skip
    else:
        put("dropout_mask", "F.dropout", f"{i.device}: torch's own")
    kernel("beam_topk", "top_logprobs.cpp", f"bias, max, top k and normaliser while the row is in cache ({built})",
           None if fp32 else "the kernel is fp32", "log_softmax and topk")  # fmt: skip
    return Plan(parts, frozenset(on), setting == Kernels.compiled, tune_malloc=tune)


def plan_for_training(model, device: str, bf16: bool, bf16_why: str, config, threads) -> Plan:
    """A Trainer's plan: from its model (a Seq2Seq), device type, precision, TrainerConfig (kernels, kernels_off)
    and nmt.threads.Threads; applied and logged."""
    inputs = Inputs(
        device, bf16, bf16_why, config.kernels, threads.count, threads.why, "train", tuple(config.kernels_off)
    )
    plan = choose(inputs, shape_of(model))
    plan.apply()
    plan.log()
    return plan


def plan_for_search(model, device: str, bf16: bool, bf16_why: str, kernels: Kernels | str) -> Plan:
    """A Translator's plan for its searches (not applied: the Translator holds it with kernels_for), logged."""
    inputs = Inputs(device, bf16, bf16_why, kernels, torch.get_num_threads(), "torch's count", "decode")
    plan = choose(inputs, shape_of(model))
    plan.log()
    return plan
