"""The training loop: epochs of step groups until a budget or early stopping ends the run, or a signal does.

    reason = run(trainer)        # "max_steps" | "max_minutes" | "max_epochs" | "early_stopping" | "interrupted"
    summary = finish(trainer, reason)

Each epoch's batches (in the order the seed and epoch give) are grouped trainer.accumulate at a time; each group
is one optimizer step, after which the weight average is updated and the hooks are told. Every log_every steps
the loss, rate, gradient norm and speed since the last log line are logged; every valid_every steps the model is
validated (nmt.trainer.validate). The budgets (max_steps, max_minutes) are checked before each step, max_epochs
after each epoch; wall-clock time is summed over resumes (trainer.elapsed), validations included. Ctrl-C / SIGTERM
finish the current step, save last.pt and stop (`stop_on_signals`). Under DistributedDataParallel every rank
stops at the same step (`any_rank`).
"""

from __future__ import annotations

import logging
import math
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist

from nmt.kernels.compiled import fallbacks
from nmt.progress import TrainingBar
from nmt.rundir import write_summary
from nmt.sampler import padding_overhead
from nmt.trainer.run import Run
from nmt.trainer.validate import validate

log = logging.getLogger(__name__)


class Stop(Exception):
    """Raised inside the loop when a stopping condition is met."""


def run(t: Run) -> str:
    """Train until a stopping condition; returns which."""
    c = t.cfg
    started = time.time()
    steps_per_epoch = math.ceil(len(t.sampler) / c.accumulate)
    total = c.max_steps or (steps_per_epoch * c.max_epochs if c.max_epochs else None)
    bar = TrainingBar(total, t.step, c.max_minutes, t.elapsed, t.is_main and c.progress)
    window = t.window
    window["time"] = time.time()
    reason = "max_epochs"
    real = padded = 0
    try:
        while c.max_epochs is None or t.epoch < c.max_epochs:
            groups = t._groups(t.epoch)
            r, p = padding_overhead(t.train_split, [b for g in groups for b in g])
            real, padded = real + r, padded + p
            while t.batch_pos < len(groups):
                if c.max_steps is not None and t.step >= c.max_steps:
                    raise Stop("max_steps")
                if any_rank(t, not _budget_left(t, started)):
                    raise Stop("max_minutes")
                step_start = time.perf_counter()
                loss_sum, n_tok, n_sent = t._train_step(groups[t.batch_pos])
                step_seconds = time.perf_counter() - step_start
                t.batch_pos += 1
                if loss_sum is not None:
                    t.step += 1
                    if t.average:
                        t.average.update(t.module, t.step)
                    window["loss"] += loss_sum
                    window["tokens"] += n_tok
                    window["sentences"] += n_sent
                    bar.advance(t.elapsed + time.time() - started)
                for hook in t.hooks:  # trainer.step is the step just taken
                    hook.on_step(t, step_seconds, n_sent, n_tok, loss_sum is None)
                if t.step % c.log_every == 0 and window["tokens"]:
                    _log_train(t, window, bar)
                if t.step % c.valid_every == 0 and loss_sum is not None:
                    t.elapsed += time.time() - started
                    started = time.time()
                    if validate(t):  # its time counts in the budget with the next update
                        raise Stop("early_stopping")
                if any_rank(t, t.interrupted):
                    raise Stop("interrupted")
            t.epoch += 1
            t.batch_pos = 0
            if t.is_main:
                log.info(
                    "epoch %d done at step %d; padding overhead %.3fx (padded/real tokens)",
                    t.epoch,
                    t.step,
                    padded / max(real, 1),
                )
    except Stop as s:
        reason = str(s)
    finally:
        t.elapsed += time.time() - started
        bar.close()
    return reason


def _budget_left(t: Run, started: float) -> bool:
    if t.cfg.max_minutes is None:
        return True
    return t.elapsed + (time.time() - started) < t.cfg.max_minutes * 60


def any_rank(t: Run, flag: bool) -> bool:
    """`flag` on any rank. Under DDP all ranks call this at the same point: they stop at the same step."""
    if t.world_size == 1:
        return flag
    f = torch.tensor([int(flag)], device=t.device)
    dist.all_reduce(f)
    return bool(f.item())


def _log_train(t: Run, window: dict, bar: TrainingBar) -> None:
    """The log line and TensorBoard's training scalars for the steps since the last one; `window` starts anew."""
    step = t.stepper
    step.numbers.check(t.cfg.max_bad_steps, t.step)  # a plan that reads the step's numbers only now
    window["loss"], step.last_grad_norm = float(window["loss"]), float(step.last_grad_norm)
    now = time.time()
    loss = window["loss"] / window["tokens"]
    tps = window["tokens"] / max(now - window["time"], 1e-9)
    sps = window["sentences"] / max(now - window["time"], 1e-9)
    lr = t.optimizer.param_groups[0]["lr"]
    bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tps:.0f}", lr=f"{lr:.2e}")
    entry = {
        "kind": "train",
        "step": t.step,
        "epoch": t.epoch,
        "loss": round(loss, 6),
        "lr": lr,
        "grad_norm": round(step.last_grad_norm, 4),
        "tokens_per_s": round(tps, 1),
        "sentences_per_s": round(sps, 2),
    }
    t.history.append(entry)
    if t.writer:
        for k in ("loss", "lr", "grad_norm", "tokens_per_s", "sentences_per_s"):
            t.writer.add_scalar(f"train/{k}", entry[k], t.step)
        log.info(
            "step %d epoch %d loss %.4f lr %.2e grad_norm %.3f tokens/s %.0f",
            t.step,
            t.epoch,
            loss,
            lr,
            step.last_grad_norm,
            tps,
        )
    window.update(loss=0.0, tokens=0, sentences=0, time=now)
    t.threads.adapt(t.step)  # trainer.threads=adaptive only


@contextmanager
def stop_on_signals(t: Run) -> Iterator[None]:
    """Inside the block, Ctrl-C / SIGTERM set t.interrupted (the loop stops after the step); a second one stops
    at once (KeyboardInterrupt: last.pt from the last save stays valid). The handlers before are put back after."""

    def handler(signum, frame):
        if t.interrupted:  # a second Ctrl-C: stop now (last.pt from the last save stays valid)
            raise KeyboardInterrupt
        t.interrupted = True
        log.warning("signal %d: finishing this step, saving last.pt, then stopping (again to abort)", signum)

    old = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            old[sig] = signal.signal(sig, handler)
        except ValueError:  # not the main thread (e.g. tests): leave signals alone
            pass
    try:
        yield
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)


def finish(t: Run, reason: str) -> dict:
    """After the loop: the last step validated (or, interrupted, saved) unless it just was; the run's summary,
    written to metrics.json by rank 0 and returned."""
    if reason != "early_stopping" and (
        not t.history or t.history[-1].get("kind") != "valid" or t.history[-1]["step"] != t.step
    ):
        if reason == "interrupted":
            t.save("last.pt")
        else:
            validate(t)
    summary = {
        "stopped_by": reason,
        "step": t.step,
        "epoch": t.epoch,
        "train_minutes": round(t.elapsed / 60, 2),
        "best": t.best,
        "final": next((h for h in reversed(t.history) if h["kind"] == "valid"), None),
        "best_checkpoint": str(t.ckpt_dir / "best.pt"),
        "last_checkpoint": str(t.ckpt_dir / "last.pt"),
        "parameters": t.module.num_parameters(),
        "threads": t.threads.record(),
        "plan": t.stepper.run_plan.record(),  # nmt.plan: {component: {implementation, reason}}
        "fallbacks": fallbacks(),  # calls a planned kernel did not take, and why (nmt.kernels.compiled)
    }
    if t.is_main:
        write_summary(t.run_dir, summary)
    return summary
