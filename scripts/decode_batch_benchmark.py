"""python scripts/decode_batch_benchmark.py CHECKPOINT SOURCE [--batch-tokens 8000,4000,2000,1000] [--out FILE]

Decoding time of one checkpoint over a source file (one sentence a line) for several decoding batch sizes
(`decoding.batch_tokens`: padded source pieces per batch), greedy and beam 5, in fp32 and under `--amp auto`:
the measurement behind nmt.decoding.Decoding's default batch size. Each setting decodes the whole file twice
after a warm-up of 50 lines; the faster of the two counts. Prefix the command with
ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 to keep torch to AVX2 (as
scripts/benchmark.py --emulate-avx2 does; the JSON records torch's CPU capability).

    python scripts/decode_batch_benchmark.py run/checkpoints/last.pt test.de --out decode_batch.json
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import datetime, timezone

import nmt.cli  # noqa: F401  (the CPU memory settings of nmt/memory.py: before torch)

# isort: split
import torch

from nmt.device import describe_machine
from nmt.translator import Translator


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint")
    p.add_argument("source", help="a text file, one source sentence a line")
    p.add_argument("--batch-tokens", default="8000,4000,2000,1000", help="comma-separated sizes to time")
    p.add_argument("--amp", default="off,auto", help="comma-separated --amp values (off: fp32)")
    p.add_argument("--beam", default="1,5", help="comma-separated beam sizes")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None, help="write every timing here (JSON)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    source = open(args.source, encoding="utf-8").read().splitlines()
    rows = []
    for amp in args.amp.split(","):
        for beam in (int(b) for b in args.beam.split(",")):
            translator = Translator.from_checkpoint(args.checkpoint, amp=amp, beam_size=beam)
            translator.fit_to(source)
            translator.translate(source[:50])  # warm-up: first calls, caches
            for size in (int(b) for b in args.batch_tokens.split(",")):
                translator.decoding.batch_tokens = size
                seconds = []
                for _ in range(2):
                    start = time.perf_counter()
                    translator.translate(source)
                    seconds.append(time.perf_counter() - start)
                row = {"amp": amp, "precision": translator.settings["precision"], "beam": beam}
                rows.append({**row, "batch_tokens": size, "seconds": round(min(seconds), 3)})
                print(json.dumps(rows[-1]), flush=True)
    report = {
        "command": "python scripts/decode_batch_benchmark.py " + " ".join(f"{k}={v}" for k, v in vars(args).items()),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "sentences": len(source),
        "machine": describe_machine(args.threads),
        "timings": rows,
    }
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
