"""Turning a composed Hydra config into the library's typed values, in one place.

Every section is checked against the dataclass it feeds (a misspelt key or a wrong type fails with
the key's name), and every user-fixable error becomes one line on stderr and exit status 2.
"""

from __future__ import annotations

import logging
import os
import sys
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nmt.errors import ConfigError, NMTError

# The config tree sits at the top of the project (installed editable, as the README says).
CONFIG_DIR = os.environ.get("NMT_CONFIG_DIR", str(Path(__file__).resolve().parents[2] / "configs"))
log = logging.getLogger("nmt")


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
        raise ConfigError(f"{section}.{key}: {msg}; fix the value on the command line or in the config") from None
    return OmegaConf.to_object(checked)


def resolve_device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name not in ("cpu", "cuda") and not name.startswith("cuda:"):
        raise ConfigError(f"device must be auto, cpu or cuda, not {name!r}")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device={name} but no CUDA GPU is visible; use device=cpu or device=auto")
    return name


def build_corpus(data: DictConfig, data_dir: str):
    """The corpus the `data` group describes."""
    from nmt import corpora

    args = dict(plain(data))
    name = args.pop("name")
    args.pop("max_length", None)
    loaders = {"bible": corpora.load_bible, "multi30k": corpora.load_multi30k,
               "files": corpora.load_files, "synthetic": corpora.load_synthetic}
    if name not in loaders:
        raise ConfigError(f"unknown corpus data.name={name!r}; choose one of {', '.join(loaders)}")
    if name == "multi30k":
        args["download_dir"] = str(Path(data_dir) / "multi30k")
    try:
        return loaders[name](**args)
    except TypeError as e:
        raise ConfigError(f"data={name}: {e}") from None


def build_model_config(model: DictConfig, attention: DictConfig):
    """ModelConfig from the `model` and `attention` groups (attention.name/query + the class's own options)."""
    from nmt.attention import ATTENTIONS
    from nmt.model import ModelConfig

    att = dict(plain(attention))
    name = att.pop("name", None)
    if name not in ATTENTIONS:
        raise ConfigError(f"unknown attention {name!r}; choose one of: {', '.join(ATTENTIONS)}")
    query = att.pop("query", "current")
    values = {**plain(model), "attention": name, "attention_query": query, "attention_options": att}
    return typed(ModelConfig, values, "model")


def load_data(cfg: DictConfig):
    """Corpus -> tokenizer -> encoded splits (cached), as `data`, `tokenizer` and `paths` say."""
    from nmt.data import TokenizerSettings, prepare

    corpus = build_corpus(cfg.data, cfg.paths.data_dir)
    settings = typed(TokenizerSettings, cfg.tokenizer, "tokenizer")
    return prepare(corpus, settings, int(cfg.data.max_length), cfg.paths.data_dir)


def setup_logging(run_dir: Path | None, rank: int = 0) -> None:
    """Hydra already logs to <run_dir>/<job>.log and the console; quiet the other ranks."""
    if rank != 0:
        logging.getLogger().setLevel(logging.WARNING)
