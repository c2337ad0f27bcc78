"""What a study's runs may differ in: their stored training configs compared key by key.

    flat = flatten(config)                     # {"trainer.max_epochs": 9, ...}
    check_comparable(configs, names)           # DataError naming the first key (and both values) that differs
    decoder_label(config)                      # "bahdanau (RNNsearch order)"

A study compares runs that differ only in the attention (`attention.*`) and the seed. Paths and the keys
that do not change what a run learns (device, threads, progress bars, logging, resume) may differ too; any
other difference is refused, since the study's claims would then rest on more than the attention. A key the
config gained after a run was trained (ADDED_LATER) counts as the value that means what such a run did, so
records of older runs combine with new ones (the encoder's self-attention: none before it existed).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from nmt.errors import DataError
from nmt.resume import flatten  # nested config -> dotted keys, as resume compares them

# config keys that do not change what a run learns (prefixes end with ".")
IGNORED_KEYS = (
    "device",
    "paths.",
    "data.root",
    "data.db_path",
    "trainer.progress",
    "trainer.resume",
    "trainer.resume_changes",  # the keys a resume changed are in the record (resumed_with_changes)
    "trainer.resume_fallback",  # which checkpoint a resume may fall back to: not what is learnt
    "trainer.overwrite",
    "trainer.threads",
    "trainer.log_every",
    "trainer.heatmaps",
)
COMPARED = ("attention.", "seed")  # what the study compares across
# keys added to the config after some recorded runs were trained -> the value that means what those runs did
ADDED_LATER = {
    "model.self_attention_layers": 0,  # nmt.self_attention: no layer before it
    "trainer.average_decay": None,  # nmt.averaging: no averaged weights before it
}


def normalised(config: dict) -> dict:
    """The config flattened (nmt.resume.flatten), with ADDED_LATER filled in where absent and the heads of
    zero self-attention layers dropped (they change nothing)."""
    flat = {**ADDED_LATER, **flatten(config)}
    if not flat.get("model.self_attention_layers"):
        flat.pop("model.self_attention_heads", None)
    return flat


def _matches(key: str, keys: Sequence[str]) -> bool:
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in keys)


def ignored(key: str) -> bool:
    return _matches(key, IGNORED_KEYS)


def compared(key: str) -> bool:
    return _matches(key, COMPARED)


def _value(flat: dict, key: str) -> str:
    return json.dumps(flat.get(key, "<unset>"), sort_keys=True)


def differing_keys(configs: Sequence[dict], skip: Callable[[str], bool] = lambda key: False) -> list[str]:
    """Dotted keys (except ignored and skipped ones) whose values are not the same in all `configs`."""
    flat = [normalised(c) for c in configs]
    keys = sorted({k for f in flat for k in f})
    return [k for k in keys if not ignored(k) and not skip(k) and len({_value(f, k) for f in flat}) > 1]


def check_comparable(configs: Sequence[dict], names: Sequence[str]) -> None:
    """DataError unless the configs differ only in the attention, the seed and ignored keys; the message
    names the first key that differs, two runs and their values."""
    keys = differing_keys(configs, compared)
    if not keys:
        return
    key = keys[0]
    flat = [normalised(c) for c in configs]
    first = _value(flat[0], key)
    other = next(i for i, f in enumerate(flat) if _value(f, key) != first)
    raise DataError(
        f"the runs differ in {key}: {names[0]} has {first}, {names[other]} has {_value(flat[other], key)}; "
        "a study compares runs that differ only in the attention and the seed (paths, threads and logging "
        "may differ): leave the other runs out, or study them separately"
    )


def decoder_label(config: dict) -> str:
    """Which decoder a run really is, from its stored config: the attention (and its score), the order of
    attention and recurrence (attention.query) and input feeding (model.input_feeding), e.g.
    "none (RNNencdec: context into every step)", "bahdanau (RNNsearch order)",
    "luong general (Luong order, input feeding)"; with model.self_attention_layers, also e.g.
    "encoder self-attention 1x4" (layers x heads)."""
    attention = config.get("attention", {})
    name, query = str(attention.get("name")), attention.get("query")
    if query == "previous":  # the context (for none: the sentence vector) is an input of every LSTM step
        order = "RNNencdec: context into every step" if name == "none" else "RNNsearch order"
    elif query == "current":  # the context joins after each LSTM step: h~ = tanh(W_c [c; h])
        order = "Luong order: context after each step" if name == "none" else "Luong order"
    else:
        order = ""
    model = config.get("model", {})
    parts = [p for p in (order, "input feeding" if model.get("input_feeding") else "") if p]
    if model.get("self_attention_layers"):  # the encoder's (nmt.self_attention): part of what the row is
        parts.append(f"encoder self-attention {model['self_attention_layers']}x{model.get('self_attention_heads')}")
    label = name + (f" {attention['score']}" if attention.get("score") else "")
    return label + (f" ({', '.join(parts)})" if parts else "")
