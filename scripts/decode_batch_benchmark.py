"""python scripts/decode_batch_benchmark.py CHECKPOINT SOURCE [--batch-tokens 8000,4000,2000,1000] [--out FILE]

Decoding time of one checkpoint over a source file (one sentence a line) for several decoding batch sizes
(`decoding.batch_tokens`: padded source pieces per batch), greedy and beam 5, in fp32 and under `--amp auto`,
and with the decoder step's kernels of each `--kernels` value (`decoding.kernels`): the measurement behind
nmt.decoding's default batch sizes and kernels. After a warm-up of 50 lines per setting, `--rounds` rounds each
decode the whole file once with every setting in turn, so that a machine whose speed drifts slows all settings
alike; the fastest round counts ("seconds"), every round is kept ("rounds"). Prefix the command with
ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 to keep torch to AVX2 (as
scripts/benchmark.py --emulate-avx2 does; the JSON records torch's CPU capability).

    python scripts/decode_batch_benchmark.py run/checkpoints/last.pt test.de --out decode_batch.json
    python scripts/decode_batch_benchmark.py last.pt test.de --amp off --beam 1,5 --batch-tokens 4000,8000 \\
        --kernels eager,auto --rounds 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import datetime, timezone

import nmt.cli  # noqa: F401  (the CPU memory settings of nmt/memory.py: before torch)

# isort: split
import torch

from nmt.memory import tune_for_decoding
from nmt.provenance import describe_machine
from nmt.translator import Translator


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint")
    p.add_argument("source", help="a text file, one source sentence a line")
    p.add_argument("--batch-tokens", default="8000,4000,2000,1000", help="comma-separated sizes to time")
    p.add_argument("--amp", default="off,auto", help="comma-separated --amp values (off: fp32)")
    p.add_argument("--beam", default="1,5", help="comma-separated beam sizes")
    p.add_argument("--kernels", default="eager", help="comma-separated kernels values (eager, auto)")
    p.add_argument("--rounds", type=int, default=2, help="passes over every setting, in turn (default 2)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None, help="write every timing here (JSON)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    tune_for_decoding()  # nmt-translate's allocator settings: this process only decodes
    source = open(args.source, encoding="utf-8").read().splitlines()
    first = Translator.from_checkpoint(args.checkpoint)
    first.fit_to(source)
    settings, outputs = [], {}
    for amp in args.amp.split(","):
        for beam in (int(b) for b in args.beam.split(",")):
            for kernels in args.kernels.split(","):
                translator = Translator(first.model, first.tokenizer, amp=amp, beam_size=beam, kernels=kernels)
                translator.max_src_pieces = first.max_src_pieces
                translator.translate(source[:50])  # warm-up: first calls, caches, the kernels' loading
                for size in (int(b) for b in args.batch_tokens.split(",")):
                    settings.append((translator, {"amp": amp, "beam": beam, "kernels": kernels, "batch_tokens": size}))
    times: list[list[float]] = [[] for _ in settings]
    for r in range(args.rounds):
        for (translator, row), seconds in zip(settings, times, strict=True):
            translator.decoding.batch_tokens = row["batch_tokens"]
            start = time.perf_counter()
            results = translator.translate(source)
            seconds.append(time.perf_counter() - start)
            outputs.setdefault((row["amp"], row["beam"]), []).append([t[0].text for t in results])
            print(json.dumps({**row, "round": r + 1, "seconds": round(seconds[-1], 3)}), flush=True)
    rows = []
    for (translator, row), seconds in zip(settings, times, strict=True):
        precision = translator.settings["precision"]
        rows.append(
            {
                **row,
                "precision": precision,
                "kernels_resolved": str(translator.kernels),
                "seconds": round(min(seconds), 3),
                "median_seconds": round(statistics.median(seconds), 3),
                "rounds": [round(s, 3) for s in seconds],
            }
        )
    same = {f"{amp}/beam{beam}": all(o == outs[0] for o in outs) for (amp, beam), outs in outputs.items()}
    report = {
        "command": "python scripts/decode_batch_benchmark.py " + " ".join(f"{k}={v}" for k, v in vars(args).items()),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "sentences": len(source),
        "machine": describe_machine(args.threads),
        "same_output_every_setting": same,  # per precision and beam: every kernels, size and round
        "timings": rows,
    }
    print(json.dumps({"same_output_every_setting": same}))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
