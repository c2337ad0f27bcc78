"""Turning a composed Hydra config into the library's typed values, in one place.

Every section is checked against the dataclass it feeds (a misspelt key or a wrong type fails with
the key's name), and every user-fixable error becomes one line on stderr and exit status 2.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import sys
import types
import typing
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nmt.errors import ConfigError, DataError, NMTError

# The config tree: configs/ at the top of the repository, installed as the package nmt.configs (editable
# or not); NMT_CONFIG_DIR points elsewhere.
CONFIG_DIR = os.environ.get("NMT_CONFIG_DIR") or str(Path(importlib.import_module("nmt.configs").__file__).parent)
log = logging.getLogger("nmt")
_FIX = "fix the value on the command line or in the config"


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


def plain(node) -> object:
    """A config node as plain Python containers (lists, dicts)."""
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node


def typed(cls, node, section: str):
    """Build dataclass `cls` from config `node`, checking names and types; errors name `section.key`."""
    values = plain(node)
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ConfigError(f"unknown key(s) {', '.join(f'{section}.{k}' for k in unknown)}; "
                          f"known keys: {', '.join(sorted(names))}")
    try:
        checked = OmegaConf.merge(OmegaConf.structured(cls), values)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", "") or ""
        msg = str(e).splitlines()[0]
        raise ConfigError(f"{section}.{key}: {msg}; {_FIX}") from None
    return OmegaConf.to_object(checked)


_KINDS = {bool: "true or false", int: "a whole number", float: "a number", str: "a string"}


def _checked_value(value, hint, key: str):
    """`value` checked against a plain type hint (bool, int, float or str, possibly optional); others pass."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    options = set(typing.get_args(hint)) if union else {hint}
    if value is None and type(None) in options:
        return value
    options.discard(type(None))
    kind = options.pop() if len(options) == 1 else None
    if kind not in _KINDS:
        return value  # e.g. a file or a pair of files: the loader checks those itself
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if (kind is bool and isinstance(value, bool)) or (kind is int and number and isinstance(value, int)):
        return value
    if kind is float and number:
        return float(value)
    if kind is str and (isinstance(value, str) or number):
        return str(value)  # Hydra reads `data.source_translation=4` as the integer 4
    raise ConfigError(f"{key}={value!r}: expected {_KINDS[kind]}; {_FIX}")


def checked_arguments(function, args: dict, section: str) -> dict:
    """`args` checked for calling `function`: an unknown name or a wrongly typed value names `section.key`."""
    params = inspect.signature(function).parameters
    unknown = sorted(set(args) - set(params))
    if unknown:
        raise ConfigError(f"unknown key(s) {', '.join(f'{section}.{k}' for k in unknown)}; "
                          f"known keys: {', '.join(sorted(params))}")
    try:
        hints = typing.get_type_hints(function)
    except Exception:  # an annotation that cannot be evaluated: leave the checks to the function
        hints = {}
    return {k: _checked_value(v, hints.get(k), f"{section}.{k}") for k, v in args.items()}


def build_corpus(data: DictConfig, data_dir: str):
    """The corpus the `data` group describes."""
    from nmt import corpora

    missing = [k for k in data if OmegaConf.is_missing(data, k)]
    if missing:
        raise ConfigError(f"data.{missing[0]} is required for data={data.get('name')}; "
                          f"give it on the command line, e.g. data.{missing[0]}=FILE")
    args = dict(plain(data))
    name = args.pop("name", None)
    args.pop("max_length", None)
    loaders = {"bible": corpora.load_bible, "multi30k": corpora.load_multi30k,
               "files": corpora.load_files, "synthetic": corpora.load_synthetic}
    if name not in loaders:
        raise ConfigError(f"unknown corpus data.name={name!r}; choose one of {', '.join(loaders)}")
    if name == "multi30k":
        args["download_dir"] = str(Path(data_dir) / "multi30k")
    args = checked_arguments(loaders[name], args, "data")
    try:
        return loaders[name](**args)
    except TypeError as e:
        raise ConfigError(f"data={name}: {e}; {_FIX}") from None


def build_model_config(model: DictConfig, attention: DictConfig):
    """ModelConfig from the `model` and `attention` groups (attention.name/query + the class's options)."""
    from nmt.attention import ATTENTIONS
    from nmt.model import ModelConfig

    att = dict(plain(attention))
    name = att.pop("name", None)
    if name not in ATTENTIONS:
        raise ConfigError(f"unknown attention.name={name!r}; choose one of: {', '.join(ATTENTIONS)} "
                          "(e.g. attention=bahdanau on the command line)")
    query = att.pop("query", "current")
    values = {**plain(model), "attention": name, "attention_query": query, "attention_options": att}
    return typed(ModelConfig, values, "model")


def load_data(cfg: DictConfig):
    """Corpus -> tokenizer -> encoded splits (cached), as `data`, `tokenizer` and `paths` say."""
    max_length = _checked_value(plain(cfg.data.get("max_length", 100)), int, "data.max_length")
    if max_length < 1:
        raise ConfigError(f"data.max_length={max_length}: use a positive number of pieces")
    corpus = build_corpus(cfg.data, cfg.paths.data_dir)  # before importing torch: bad files fail fast
    check_splits(corpus)

    from nmt.data import TokenizerSettings, prepare

    settings = typed(TokenizerSettings, cfg.tokenizer, "tokenizer")
    if settings.type not in ("unigram", "bpe", "char", "word"):
        raise ConfigError(f"tokenizer.type={settings.type!r}: use unigram, bpe, char or word")
    if settings.vocab_size < 8:
        raise ConfigError(f"tokenizer.vocab_size={settings.vocab_size}: use at least 8 (4 special pieces)")
    if not 0 < settings.character_coverage <= 1:
        raise ConfigError(f"tokenizer.character_coverage={settings.character_coverage}: "
                          "use a value in (0, 1]")
    try:
        return prepare(corpus, settings, max_length, cfg.paths.data_dir)
    except OSError as e:
        cache = Path(cfg.paths.data_dir) / "cache"
        raise DataError(f"{cache}: cannot write the prepared data ({e.strerror or e}); free disk space or "
                        "point paths.data_dir at a writable folder with room") from None


def check_splits(corpus) -> None:
    """Training needs pairs in `train` and `valid`; say which split is empty and how to fill it."""
    sizes = ", ".join(f"{k} {len(v)}" for k, v in corpus.splits.items())
    if not corpus.splits.get("train"):
        raise DataError(f"corpus {corpus.name} has no training pairs ({sizes}); give more data, or lower "
                        "data.valid_percent/data.test_percent (data=files)")
    if not corpus.splits.get("valid"):
        hint = ("give a validation set with data.valid=FILE, or more lines or a larger data.valid_percent"
                if corpus.name == "files" else "use a larger corpus (data.valid_size for data=synthetic)")
        raise DataError(f"corpus {corpus.name} has no validation pairs ({sizes}); {hint}")


def build_run(cfg: DictConfig, run_dir: str | Path, device: str = "cpu", data=None, resume: str | None = None,
              rank: int = 0, world_size: int = 1, hooks: Sequence = ()):
    """The Trainer of a composed training config, built the one way every command and script builds it:
    the typed trainer/optim/model sections, the prepared data (`data`, when the caller prepared it, e.g. to
    time it or to order it between processes), the model from `cfg.seed` (random and torch seeded), and the
    Trainer with the resolved config, `resume` (a checkpoint path, or None) and `hooks` (TrainerHook)."""
    import random

    import torch

    from nmt.model import Seq2Seq
    from nmt.trainer import OptimConfig, Trainer, TrainerConfig

    tcfg = typed(TrainerConfig, cfg.trainer, "trainer")
    ocfg = typed(OptimConfig, cfg.optim, "optim")
    mcfg = build_model_config(cfg.model, cfg.attention)
    data = load_data(cfg) if data is None else data
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    model = Seq2Seq(mcfg, data.tokenizer.src_vocab_size, data.tokenizer.tgt_vocab_size)
    tcfg.resume = resume
    return Trainer(model, data, tcfg, ocfg, run_dir, device, cfg.seed, plain(cfg), rank, world_size, hooks)
