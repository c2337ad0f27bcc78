"""Validation during training: every trainer.valid_every steps and at the end, the model (the weight average where
there is one) scores the validation split (nmt.validation.evaluate_split); the result is recorded, drives the best
checkpoint, the plateau schedule and early stopping, goes to the log and TensorBoard, and last.pt is written.

    stop = validate(trainer)   # True: trainer.patience validations in a row without improvement

Under DistributedDataParallel all ranks validate (identically) and rank 0's numbers decide for all.
"""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext

import torch.distributed as dist

from nmt.rundir import write_text
from nmt.trainer.run import Run
from nmt.validation import evaluate_split

log = logging.getLogger(__name__)
SCORES = ("loss", "ppl", "bleu", "chrf")


def validate(t: Run) -> bool:
    """Validate, log, checkpoint (and tell the hooks); True when early stopping says stop."""
    start = time.perf_counter()
    try:
        return _validate_once(t)
    finally:
        for hook in t.hooks:
            hook.on_validation(t, time.perf_counter() - start)


def _validate_once(t: Run) -> bool:
    c = t.cfg
    with t.average.applied(t.module) if t.average else nullcontext():
        metrics = evaluate_split(
            t.module,
            t.data,
            "valid",
            t.device,
            c.valid_batch_tokens,
            c.length_buckets,
            c.valid_max_sentences,
            t.stepper.autocast,
            heatmaps=c.heatmaps if t.writer else 0,
        )
    if t.world_size > 1:  # GPU kernels need not agree to the last bit: rank 0's numbers decide for all
        shared = [{k: metrics[k] for k in (*SCORES, "by_length")}]
        dist.broadcast_object_list(shared, src=0)
        metrics.update(shared[0])
    metric = metrics[c.best_metric]
    lower_better = c.best_metric in ("loss", "ppl")
    improved = not t.best or (metric < t.best["value"] if lower_better else metric > t.best["value"])
    entry = {
        "kind": "valid",
        "step": t.step,
        "epoch": t.epoch,
        "elapsed": round(t.elapsed, 1),
        **{k: metrics[k] for k in SCORES},
        "by_length": metrics["by_length"],
    }
    t.history.append(entry)
    t.rate.validated(metric)
    if improved:
        t.bad_validations = 0
        t.best = {
            "metric": c.best_metric,
            "value": metric,
            "step": t.step,
            "epoch": t.epoch,
            **{k: metrics[k] for k in SCORES},
        }
    else:
        t.bad_validations += 1
    if t.is_main:
        _report(t, entry, metrics)
    t.save("last.pt", best=improved)
    return bool(c.patience) and t.bad_validations >= c.patience


def _report(t: Run, entry: dict, metrics: dict) -> None:
    """The validation's log line, TensorBoard scalars and figures, and its hypotheses in valid/step_<N>.hyp."""
    step, writer = t.step, t.writer
    log.info(
        "validation at step %d%s: loss %.4f ppl %.2f BLEU %.2f chrF %.2f%s",
        step,
        " (averaged weights)" if t.average else "",
        entry["loss"],
        entry["ppl"],
        entry["bleu"],
        entry["chrf"],
        " (new best)" if t.best.get("step") == step else "",
    )
    for k in SCORES:
        writer.add_scalar(f"valid/{k}", entry[k], step)
    for row in entry["by_length"]:
        if row["bleu"] is not None:
            writer.add_scalar(f"valid_bleu_by_length/{row['bucket']}", row["bleu"], step)
    for i, fig in enumerate(metrics["figures"]):
        writer.add_figure(f"attention/valid_{i}", fig, step)
    for i, fig in enumerate(metrics.get("self_figures", [])):  # model.self_attention_layers > 0
        writer.add_figure(f"self_attention/valid_{i}", fig, step)
    write_text(t.run_dir / "valid" / f"step_{step:07d}.hyp", "".join(h + "\n" for h in metrics["hypotheses"]))
    writer.flush()
