"""nmt-translate: translate text with a checkpoint, from the arguments or line by line from stdin.

    nmt-translate run/checkpoints/best.pt "ein kleiner Test ."
    nmt-translate run/checkpoints/best.pt < input.de > output.en
    nmt-translate run/checkpoints/best.pt --beam 5 --nbest 3 --print-alignment --plot heatmaps/

Lines are read as they arrive and answered at once (it works interactively and in a pipe); lines that
are already waiting are translated together, up to --batch-size. Deliberately free of Hydra, and torch
is imported only once the arguments are parsed, so `--help` and errors are quick.
"""

from __future__ import annotations

import argparse
import logging
import os
import select
import sys
from collections.abc import Iterator

from nmt.choices import Amp, Kernels
from nmt.decoding import Decoding  # torch-free: the defaults below are the library's

EPILOG = """output:
  one line per input line, in order; an empty input line gives an empty output line.
  --nbest N: N lines per input line, each SCORE<TAB>TEXT, best first (SCORE = log-probability / length
  penalty); missing hypotheses (an empty input has one) are filled with "-inf<TAB>" lines.
  --print-alignment: after every translation line, one line "tgt->src tgt->src ..." pairing each output
  piece (</s> included) with the source piece it attends to most ("tgt->?" for attention=none).
  --plot DIR (or --attention DIR): DIR/<line>.png, the best translation's attention heatmap of input line
  <line> (1-based); with a model trained with model.self_attention_layers > 0, also DIR/<line>-self.png: the
  encoder's self-attention over the source, one source x source map per layer (rows) and head (columns).

examples:
  nmt-translate outputs/2024-05-01/12-00-00/checkpoints/best.pt "Im Anfang schuf Gott Himmel und Erde ."
  cat test.de | nmt-translate best.pt --beam 5 > test.hyp
  nmt-translate best.pt --nbest 3 --beam 5 --print-alignment < sentences.txt
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="nmt-translate",
        description="Translate text with an nmt checkpoint.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("checkpoint", help="a checkpoint written by nmt-train, e.g. <run dir>/checkpoints/best.pt")
    p.add_argument("text", nargs="*", default=[], help="sentences to translate (default: each line of stdin)")
    p.add_argument(
        "--beam", type=int, default=Decoding.beam_size, metavar="N", help="beam size (default %(default)s: greedy)"
    )
    p.add_argument("--nbest", type=int, default=Decoding.nbest, metavar="N", help="print the N best (N <= beam)")
    p.add_argument(
        "--length-penalty",
        type=float,
        default=Decoding.length_penalty,
        metavar="A",
        help="GNMT alpha: score / ((5 + length) / 6) ** A (default %(default)s)",
    )
    p.add_argument(
        "--max-len-ratio",
        type=float,
        default=Decoding.max_len_ratio,
        metavar="R",
        help=f"output at most R x source pieces + {Decoding.max_len_extra} (default %(default)s)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=32,
        metavar="N",
        help="translate up to N waiting lines together (default 32; the output is the same)",
    )
    p.add_argument("--device", default="auto", help="auto (the default: cuda if any), cpu, cuda, cuda:N")
    p.add_argument(
        "--amp",
        default=Decoding.amp.value,
        choices=[a.value for a in Amp],
        help="bf16 autocast: auto (the default) uses it where the hardware computes bf16 (CUDA; CPUs "
        "with AVX-512 BF16 or AMX), off decodes in fp32",
    )
    p.add_argument(
        "--kernels",
        default=Decoding.kernels.value,
        choices=[k.value for k in Kernels],
        help="the search's C++ kernels: auto (the default) where the plan finds them right, fp32 on a CPU with a "
        "C++ compiler (built once per machine, a few seconds; later runs load them at once), eager never; the log's "
        "plan table says which and why",
    )
    p.add_argument(
        "--plot",
        "--attention",
        dest="attention",
        metavar="DIR",
        help="write one attention heatmap PNG per input line to DIR (and the self-attention maps, if any)",
    )
    p.add_argument(
        "--print-alignment",
        action="store_true",
        help="after each translation, print the most attended source piece of every output piece",
    )
    args = p.parse_intermixed_args(argv)
    for name in ("beam", "nbest", "batch_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.nbest > args.beam:
        p.error(f"--nbest {args.nbest} needs --beam of at least {args.nbest}")
    return args


def stdin_batches(max_lines: int, fd: int = 0) -> Iterator[list[str]]:
    """Lines of `fd` in groups: wait for a first line, then add only lines already waiting (<= max_lines)."""
    buffer, lines, eof = b"", [], False
    while not eof or lines:
        while not eof and len(lines) < max_lines and (not lines or select.select([fd], [], [], 0)[0]):
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                eof = True
                if buffer:  # a last line without a newline
                    lines.append(buffer)
                break
            *complete, buffer = (buffer + chunk).split(b"\n")
            lines += complete
        if lines:
            batch, lines = lines[:max_lines], lines[max_lines:]
            yield [line.removesuffix(b"\r").decode("utf-8", errors="replace") for line in batch]


def alignment_line(t, has_alignment: bool) -> str:
    """'tgt->src ...': the most attended source piece of every output piece."""
    if not has_alignment or not t.tgt_pieces:
        return " ".join(f"{p}->?" for p in t.tgt_pieces)
    best = t.attention.argmax(dim=-1).tolist()  # (T+1,) source position per output piece
    return " ".join(f"{p}->{t.src_pieces[s]}" for p, s in zip(t.tgt_pieces, best, strict=True))


def write_results(translator, args: argparse.Namespace, texts: list[str], first_line: int) -> None:
    """Translate `texts` (input lines first_line, first_line + 1, ...) and print them, flushing at the end."""
    results = translator.translate(texts, first_line=first_line)
    out = []
    for n, (text, hyps) in enumerate(zip(texts, results, strict=True)):
        shown = hyps[: args.nbest]
        for t in shown:
            line = t.text.replace("\n", " ")
            out.append(f"{t.score:.4f}\t{line}" if args.nbest > 1 else line)
            if args.print_alignment:
                out.append(alignment_line(t, translator.has_alignment))
        out += ["-inf\t"] * (args.nbest - len(shown)) if args.nbest > 1 else []
        if args.attention and text.strip():
            from nmt.plotting import attention_figure, save_figure, self_attention_figure

            t = hyps[0]
            fig = attention_figure(
                t.attention, t.src_pieces, t.tgt_pieces, title=text[:80], has_alignment=translator.has_alignment
            )
            save_figure(fig, os.path.join(args.attention, f"{first_line + n}.png"))
            weights = translator.self_attention(text)  # (layers, heads, S, S), None without the layer
            if weights is not None:
                fig = self_attention_figure(weights, t.src_pieces, title=text[:80])
                save_figure(fig, os.path.join(args.attention, f"{first_line + n}-self.png"))
    sys.stdout.write("".join(line + "\n" for line in out))
    sys.stdout.flush()


def valid_text(text: str) -> str:
    """`text` with undecodable command-line bytes (lone surrogates in Python) replaced by U+FFFD."""
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate that does not stand for a byte
        raw = text.encode("utf-8", "surrogatepass")
    return raw.decode("utf-8", errors="replace")


def translate(args: argparse.Namespace) -> None:
    from nmt.checkpoint import load_checkpoint
    from nmt.device import resolve_device
    from nmt.errors import ConfigError
    from nmt.restore import model_from_checkpoint
    from nmt.translator import Translator

    device = resolve_device(args.device, "--device ")
    model, tokenizer = model_from_checkpoint(load_checkpoint(args.checkpoint), device, path=args.checkpoint)
    translator = Translator(
        model,
        tokenizer,
        device,
        beam_size=args.beam,
        nbest=args.nbest,
        length_penalty=args.length_penalty,
        max_len_ratio=args.max_len_ratio,
        amp=args.amp,
        kernels=args.kernels,
    )
    translator.checkpoint = args.checkpoint
    if args.attention:
        try:
            os.makedirs(args.attention, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"--plot {args.attention}: cannot create it ({e.strerror})") from None
    if args.text:
        texts = [valid_text(text) for text in args.text]
        for start in range(0, len(texts), args.batch_size):
            write_results(translator, args, texts[start : start + args.batch_size], start + 1)
        return
    line = 1
    for batch in stdin_batches(args.batch_size):
        write_results(translator, args, batch, line)
        line += len(batch)


def main(argv: list[str] | None = None) -> None:
    from nmt.cli.interrupt import running

    with running("nmt-translate"):  # Ctrl-C: one line, exit 130 (nmt.cli.interrupt)
        _main(argv)


def _main(argv: list[str] | None) -> None:
    args = parse_args(argv)
    logging.basicConfig(format="nmt-translate: warning: %(message)s", level=logging.WARNING)
    from nmt.errors import command_errors
    from nmt.memory import tune_for_decoding

    tune_for_decoding()  # this process only decodes (nmt/memory.py)

    try:
        with command_errors("nmt-translate"):
            translate(args)
    except BrokenPipeError:  # e.g. `nmt-translate ... | head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(141)


if __name__ == "__main__":
    main()
