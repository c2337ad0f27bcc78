"""The config schema: the library's own dataclasses, registered in Hydra's ConfigStore.

Each config group has a schema named `schema` (`schema_<name>` where the group holds several shapes:
one per attention, one per corpus). The YAML files under configs/ select a schema in their defaults list
and set only what differs from it, so every default is written once: in the dataclass, or in the
signature of the function a schema is read from (an attention class, a corpus loader). Hydra validates
the composed config against the schema (an unknown key, a wrong type or a value outside a choice fails
while composing, naming the key); `nmt-train --cfg job` prints every value.

    trainer     nmt.trainer.TrainerConfig          optim      nmt.trainer.OptimConfig
    tokenizer   nmt.data.TokenizerSettings         decoding   nmt.decoding.Decoding
    model       nmt.model.ModelConfig, less the attention fields
    attention   name, query, and the class's own arguments (nmt.attention.ATTENTIONS)
    data        name, max_length, and the loader's arguments (nmt.corpora.LOADERS)
    paths       Paths
"""

from __future__ import annotations

import inspect
import typing
from dataclasses import MISSING, Field, dataclass, field, fields, make_dataclass
from enum import Enum
from pathlib import Path
from types import NoneType, UnionType
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING as REQUIRED

from nmt.attention import ATTENTIONS
from nmt.choices import Kernels
from nmt.corpora import LOADERS
from nmt.data import DEFAULT_MAX_LENGTH, TokenizerSettings
from nmt.decoding import Decoding
from nmt.metrics import DEFAULT_EDGES
from nmt.model import ModelConfig
from nmt.trainer import OptimConfig, TrainerConfig

ATTENTION_FIELDS = ("attention", "attention_query", "attention_options")  # filled from the attention group
NOT_CONFIG = {"download_dir"}  # loader arguments the CLI sets itself (from paths.data_dir)


@dataclass
class Paths:
    data_dir: str = "data"  # corpora, downloads and caches (relative to the directory you run from)


@dataclass
class TrainSchema:
    """nmt-train's (and nmt-prepare's) top level; the groups have schemas of their own."""

    seed: int = 1234
    device: str = "auto"  # auto (cuda if available) | cpu | cuda | cuda:N
    paths: Any = REQUIRED
    data: Any = REQUIRED
    tokenizer: Any = REQUIRED
    model: Any = REQUIRED
    attention: Any = REQUIRED
    optim: Any = REQUIRED
    trainer: Any = REQUIRED
    kernels: Kernels = Kernels.auto  # auto | eager, for training and decoding alike (nmt.plan; docs/usage.md)


@dataclass
class EvaluateSchema:
    """nmt-evaluate's top level."""

    checkpoint: str = REQUIRED
    split: str = "test"
    output: str | None = None  # null: <run dir>/eval, where the run dir holds checkpoints/<checkpoint>
    buckets: list[int] = field(default_factory=lambda: list(DEFAULT_EDGES))  # source-length edges (words)
    heatmaps: int = 4  # attention heatmaps of sentences spread over source lengths, the longest included
    device: str = "auto"
    kernels: Kernels = Kernels.auto  # auto | eager (nmt.plan; docs/usage.md)
    decoding: Any = REQUIRED
    paths: Any = REQUIRED
    data: Any = None  # null: the corpus stored in the checkpoint


_PLAIN = (int, float, bool, str)


def _config_type(hint: object) -> object:
    """`hint` where OmegaConf can check it (plain types, enums, optional ones, lists of plain types); else Any."""
    if hint in _PLAIN or (isinstance(hint, type) and issubclass(hint, Enum)):
        return hint
    if typing.get_origin(hint) in (typing.Union, UnionType):
        args = [a for a in typing.get_args(hint) if a is not NoneType]
        inner = _config_type(args[0]) if len(args) == 1 else Any
        return Any if inner is Any else inner | None
    if typing.get_origin(hint) is list and all(a in _PLAIN for a in typing.get_args(hint)):
        return hint
    return Any


def _copy(f: Field) -> Field:
    if f.default_factory is not MISSING:
        return field(default_factory=f.default_factory)
    return field(default=f.default)


def from_signature(name: str, function, first: list[tuple], skip: set[str]) -> type:
    """A dataclass named `name`: the `first` fields, then `function`'s keyword parameters with their hints
    (as far as OmegaConf can check them) and defaults (required, ???, where there is none)."""
    hints = typing.get_type_hints(function)
    extra = [
        (
            p.name,
            _config_type(hints.get(p.name, Any)),
            field(default=REQUIRED if p.default is inspect.Parameter.empty else p.default),
        )
        for p in inspect.signature(function).parameters.values()
        if p.name not in skip and p.kind is not inspect.Parameter.VAR_KEYWORD
    ]
    return make_dataclass(name, [*first, *extra], kw_only=True)


def model_schema() -> type:
    """ModelConfig without the fields that the attention group fills."""
    hints = typing.get_type_hints(ModelConfig)
    return make_dataclass(
        "ModelSchema",
        [(f.name, hints[f.name], _copy(f)) for f in fields(ModelConfig) if f.name not in ATTENTION_FIELDS],
    )


def attention_schema(name: str) -> type:
    query = next(f for f in fields(ModelConfig) if f.name == "attention_query")
    first = [
        ("name", str, field(default=name)),
        ("query", typing.get_type_hints(ModelConfig)["attention_query"], field(default=query.default)),
    ]
    cls = ATTENTIONS[name]
    return from_signature(f"{cls.__name__}Schema", cls.__init__, first, {"self", "query_dim", "value_dim"})


def data_schema(name: str) -> type:
    first = [
        ("name", str, field(default=name)),
        ("max_length", int, field(default=DEFAULT_MAX_LENGTH)),
    ]  # longer training pairs are dropped
    return from_signature(f"{name.title()}Data", LOADERS[name], first, NOT_CONFIG)


def register() -> None:
    """Store every schema in Hydra's ConfigStore (idempotent)."""
    store = ConfigStore.instance()
    store.store(name="train_schema", node=TrainSchema)
    store.store(name="evaluate_schema", node=EvaluateSchema)
    for group in ("trainer", "optim", "tokenizer", "decoding", "paths", "model"):
        store.store(group="schema", name=group, node=schema_of(group))
    for name in ATTENTIONS:
        store.store(group="schema", name=f"attention_{name}", node=attention_schema(name))
    for name in LOADERS:
        store.store(group="schema", name=f"data_{name}", node=data_schema(name))
    register_launcher(store)


def register_launcher(store: ConfigStore) -> None:
    """hydra/launcher=nmt_basic (configs/launcher/sequential.yaml): nmt.cli.launcher.ClaimingLauncher, as
    hydra_plugins/nmt_launcher names it (Hydra takes launchers from its hydra_plugins package only)."""
    store.store(group="hydra/launcher", name="nmt_basic", node={"_target_": "hydra_plugins.nmt_launcher.NMTLauncher"})
    import hydra_plugins  # a namespace package; an editable install's finder hides its folder from Hydra's scan

    here = str(Path(__file__).resolve().parents[2] / "hydra_plugins")
    if Path(here, "nmt_launcher").is_dir() and here not in list(hydra_plugins.__path__):
        hydra_plugins.__path__.append(here)


def schema_of(group: str, name: str | None = None) -> type:
    """The dataclass a config group's values are checked against (`name`: the attention or corpus)."""
    if group == "attention":
        return attention_schema(name)
    if group == "data":
        return data_schema(name)
    return {
        "trainer": TrainerConfig,
        "optim": OptimConfig,
        "tokenizer": TokenizerSettings,
        "decoding": Decoding,
        "paths": Paths,
        "model": model_schema(),
    }[group]
