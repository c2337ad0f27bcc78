"""Turning a composed Hydra config into the library's typed values, in one place.

The schema (nmt.cli.schema) is registered here, so every command composes against it: Hydra rejects an
unknown key, a wrong type or a value outside a choice while composing. `typed` reads a section as its
dataclass; configs that did not come through Hydra (the one stored in a checkpoint, one built in a test)
are checked against the same schema there. Every user-fixable error becomes one line on stderr and exit
status 2.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nmt.cli.schema import register, schema_of
from nmt.errors import ConfigError, DataError, NMTError

# The config tree: configs/ at the top of the repository, installed as the package nmt.configs (editable
# or not); NMT_CONFIG_DIR points elsewhere.
CONFIG_DIR = os.environ.get("NMT_CONFIG_DIR") or str(Path(importlib.import_module("nmt.configs").__file__).parent)
log = logging.getLogger("nmt")
_FIX = "fix the value on the command line or in the config"
register()


@contextmanager
def user_errors():
    """Print an NMTError as one line (no traceback) and exit 2; NMT_DEBUG=1 shows the traceback."""
    try:
        yield
    except NMTError as e:
        if os.environ.get("NMT_DEBUG") or os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


def compose_config(overrides: Sequence[str] = (), name: str = "train", hydra_config: bool = False) -> DictConfig:
    """The config `name` composed with `overrides` as the command line would (for scripts and tests)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose(name, overrides=list(overrides), return_hydra_config=hydra_config)


def plain(node) -> object:
    """A config node as plain Python containers (lists, dicts; choices as str)."""
    return OmegaConf.to_container(node, resolve=True, enum_to_str=True) if OmegaConf.is_config(node) else node


def typed(cls, node, section: str):
    """Dataclass `cls` from config `node`, checked by OmegaConf against `cls` (a no-op for a section Hydra
    composed against that schema); an unknown key or a wrong value is a ConfigError naming `section.key`."""
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cls), plain(node)))
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", "") or ""
        msg = str(e).splitlines()[0]
        raise ConfigError(f"{section}.{key}: {msg}; {_FIX}") from None


def data_section(data):
    """The `data` section (or a checkpoint's stored copy of it) checked against its corpus's schema."""
    from nmt.corpora import LOADERS

    name = plain(data).get("name")
    if name not in LOADERS:
        raise ConfigError(f"unknown corpus data.name={name!r}; choose one of {', '.join(LOADERS)}")
    missing = [k for k in data if OmegaConf.is_config(data) and OmegaConf.is_missing(data, k)]
    if missing:
        raise ConfigError(
            f"data.{missing[0]} is required for data={name}; give it on the command line, e.g. data.{missing[0]}=FILE"
        )
    return typed(schema_of("data", name), data, "data")


def build_corpus(data, data_dir: str):
    """The corpus the `data` section describes."""
    from dataclasses import asdict

    from nmt.corpora import LOADERS

    args = asdict(data_section(data))
    name = args.pop("name")
    del args["max_length"]  # the tokenized data's limit, not the loader's
    if name == "multi30k":
        args["download_dir"] = str(Path(data_dir) / "multi30k")
    return LOADERS[name](**args)


def build_model_config(model: DictConfig, attention: DictConfig):
    """ModelConfig from the `model` and `attention` groups (attention.name/query + the class's options)."""
    from nmt.attention import ATTENTIONS
    from nmt.model import ModelConfig

    name = plain(attention).get("name")
    if name not in ATTENTIONS:
        raise ConfigError(
            f"unknown attention.name={name!r}; choose one of: {', '.join(ATTENTIONS)} "
            "(e.g. attention=bahdanau on the command line)"
        )
    options = plain(OmegaConf.structured(typed(schema_of("attention", name), attention, "attention")))
    del options["name"]
    query = options.pop("query")
    sizes = plain(OmegaConf.structured(typed(schema_of("model"), model, "model")))
    return ModelConfig(**sizes, attention=name, attention_query=query, attention_options=options)


def load_data(cfg: DictConfig):
    """Corpus -> tokenizer -> encoded splits (cached), as `data`, `tokenizer` and `paths` say."""
    max_length = data_section(cfg.data).max_length
    if max_length < 1:
        raise ConfigError(f"data.max_length={max_length}: use a positive number of pieces")
    corpus = build_corpus(cfg.data, cfg.paths.data_dir)  # before the tokenizer: bad files fail fast
    check_splits(corpus)

    from nmt.data import TokenizerSettings, prepare

    settings = typed(TokenizerSettings, cfg.tokenizer, "tokenizer")
    if settings.vocab_size < 8:
        raise ConfigError(f"tokenizer.vocab_size={settings.vocab_size}: use at least 8 (4 special pieces)")
    if not 0 < settings.character_coverage <= 1:
        raise ConfigError(f"tokenizer.character_coverage={settings.character_coverage}: use a value in (0, 1]")
    try:
        data = prepare(corpus, settings, max_length, cfg.paths.data_dir)
    except OSError as e:
        cache = Path(cfg.paths.data_dir) / "cache"
        raise DataError(
            f"{cache}: cannot write the prepared data ({e.strerror or e}); free disk space or "
            "point paths.data_dir at a writable folder with room"
        ) from None
    long = data.over_length(max_length)
    if long:
        counts = ", ".join(f"{split} {n}/{len(data.encoded[split])}" for split, n in long.items())
        logging.getLogger("nmt").info(
            "evaluation pairs longer than data.max_length=%d pieces (kept: evaluation drops nothing): %s",
            max_length,
            counts,
        )
    return data


def check_splits(corpus) -> None:
    """Training needs pairs in `train` and `valid`; say which split is empty and how to fill it."""
    sizes = ", ".join(f"{k} {len(v)}" for k, v in corpus.splits.items())
    if not corpus.splits.get("train"):
        raise DataError(
            f"corpus {corpus.name} has no training pairs ({sizes}); give more data, or lower "
            "data.valid_percent/data.test_percent (data=files)"
        )
    if not corpus.splits.get("valid"):
        hint = (
            "give a validation set with data.valid=FILE, or more lines or a larger data.valid_percent"
            if corpus.name == "files"
            else "use a larger corpus (data.valid_size for data=synthetic)"
        )
        raise DataError(f"corpus {corpus.name} has no validation pairs ({sizes}); {hint}")


def build_run(
    cfg: DictConfig,
    run_dir: str | Path,
    device: str = "cpu",
    data=None,
    resume: str | None = None,
    rank: int = 0,
    world_size: int = 1,
    hooks: Sequence = (),
):
    """The Trainer of a composed training config, built the one way every command and script builds it:
    the typed trainer/optim/model sections, the prepared data (`data`, when the caller prepared it, e.g. to
    time it or to order it between processes), the model from `cfg.seed` (random and torch seeded), and the
    Trainer with the resolved config, `resume` (a checkpoint path, or None) and `hooks` (TrainerHook)."""
    import random

    import torch

    from nmt.averaging import check_decay
    from nmt.model import Seq2Seq
    from nmt.trainer import OptimConfig, Trainer, TrainerConfig

    tcfg = typed(TrainerConfig, cfg.trainer, "trainer")
    check_decay(tcfg.average_decay)  # before the data is prepared
    ocfg = typed(OptimConfig, cfg.optim, "optim")
    mcfg = build_model_config(cfg.model, cfg.attention)
    data = load_data(cfg) if data is None else data
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    try:
        model = Seq2Seq(mcfg, data.tokenizer.src_vocab_size, data.tokenizer.tgt_vocab_size)
    except ValueError as e:  # sizes that do not fit together (heads, dot-score sizes): the config's to fix
        raise ConfigError(str(e)) from None
    tcfg.resume = resume
    return Trainer(model, data, tcfg, ocfg, run_dir, device, cfg.seed, plain(cfg), rank, world_size, hooks)
