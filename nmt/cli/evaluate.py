"""nmt-evaluate: score a checkpoint on a split (BLEU, chrF, TER with signatures, BLEU by source length).

    nmt-evaluate checkpoint=outputs/2024-05-01/12-00-00/checkpoints/best.pt
    nmt-evaluate checkpoint=run/checkpoints/best.pt split=valid decoding=beam decoding.beam_size=10
    nmt-evaluate checkpoint=run/checkpoints/best.pt data=multi30k data.root=../shared/data/multi30k
    nmt-evaluate checkpoint=run/checkpoints/best.pt output=eval/beam5 heatmaps=8 buckets=[0,5,10,20]

The corpus is the one the checkpoint was trained on (its stored `data` config) unless `data=...` names
another, which is then encoded with the checkpoint's tokenizer. The report is printed; the files
(<split>.json/.hyp/.md, <split>_bleu_by_length.png, attention/*.png) go to `output`, by default
<run dir>/eval: checked writable before decoding, each file written whole or not at all; a file that cannot be
written is one line naming it and the fix, after the report. Hydra writes nothing of its own (no run directory,
no log file).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from nmt.cli.common import CONFIG_DIR, build_corpus, plain, typed, user_errors
from nmt.cli.strict import strict_keys
from nmt.device import resolve_device
from nmt.errors import ConfigError, OutputError


def default_output(checkpoint: Path) -> Path:
    """<run dir>/eval for <run dir>/checkpoints/x.pt, else eval/ next to the checkpoint."""
    folder = checkpoint.resolve().parent
    return (folder.parent if folder.name == "checkpoints" else folder) / "eval"


def run(cfg: DictConfig) -> dict:
    from nmt.checkpoint import load_checkpoint
    from nmt.decoding import Decoding
    from nmt.evaluation import check_writable, evaluate
    from nmt.metrics import check_edges
    from nmt.restore import model_from_checkpoint
    from nmt.translator import Translator

    if OmegaConf.is_missing(cfg, "checkpoint"):
        raise ConfigError(
            "no checkpoint given; run e.g. nmt-evaluate checkpoint=outputs/<date>/<time>/checkpoints/best.pt"
        )
    checkpoint = Path(str(cfg.checkpoint))
    edges = check_edges(plain(cfg.buckets), "buckets")
    decoding = typed(Decoding, cfg.decoding, "decoding")
    payload = load_checkpoint(checkpoint)

    if cfg.get("data") is not None:
        data = cfg.data
    elif isinstance(payload.get("config"), dict) and payload["config"].get("data"):
        data = OmegaConf.create(payload["config"]["data"])
    else:
        raise ConfigError(f"{checkpoint}: stores no corpus description; name one, e.g. data=multi30k data.root=DIR")
    corpus = build_corpus(data, cfg.paths.data_dir)
    if cfg.split not in corpus.splits:
        raise ConfigError(
            f"split={cfg.split} is not a split of corpus {corpus.name}; available: {', '.join(corpus.splits)}"
        )

    out_dir = Path(cfg.output) if cfg.output else default_output(checkpoint)
    check_writable(out_dir)  # before decoding, which may take long
    device = resolve_device(cfg.device)
    model, tokenizer = model_from_checkpoint(payload, device, path=checkpoint)
    translator = Translator(model, tokenizer, device, **asdict(decoding))
    translator.checkpoint = str(checkpoint)
    meta = {
        "corpus": corpus.name,
        "src_lang": corpus.src_lang,
        "tgt_lang": corpus.tgt_lang,
        "step": payload.get("step"),
    }
    pairs = corpus.splits[cfg.split]
    return evaluate(translator, pairs, edges, int(cfg.heatmaps), out_dir, cfg.split, meta, progress=True)


@strict_keys("evaluate")  # a misspelt key, with or without +: one line, exit 2 (nmt.cli.strict)
@hydra.main(config_path=CONFIG_DIR, config_name="evaluate", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from nmt.evaluation import format_report
    from nmt.memory import tune_for_decoding

    tune_for_decoding()  # this process only decodes (nmt/memory.py)
    with user_errors():
        try:
            result = run(cfg)
        except OutputError as e:  # the scores first, then the one line on what could not be written
            if e.result is not None:
                print(format_report({**e.result, "files": {}}))
            raise
        print(format_report(result))


if __name__ == "__main__":
    main()
