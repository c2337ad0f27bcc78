"""Several checkpoints side by side: load them once, translate one text with all of them (nmt-serve's core).

    models = load_models(["none/best.pt", "luong/best.pt"], device="cpu")
    reply = translate_all(models, "ein kleiner Test .", beam=5, limits=Limits())
    reply["results"][1]["weights"]        # (len(tgt_pieces), len(src_pieces)) nested lists
    reply["results"][1]["self_attention"] # None, or {"layers", "heads", "weights": [layer][head][query][key]}

Each model has two locks, one per lane (nmt/serve/lanes.py: short requests have a lane of their own): a model
translates at most one long and one short request at once (its weights are only read; the two share its
Translators, made while neither translates), and different models (so the checkpoints of one request) run side
by side in threads. Inputs are bounded before any model runs:
a text over `Limits.max_chars` characters is cut there, a source over `Limits.max_pieces` pieces is cut
by the Translator to that many (EOS kept), and both cuts are reported as notes in the reply. Nothing here
knows about HTTP (nmt/serve/app.py); the HTML page is drawn by nmt/serve/page.py.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from nmt.checkpoint import load_checkpoint
from nmt.errors import NMTError
from nmt.model import Seq2Seq
from nmt.restore import model_from_checkpoint
from nmt.tokenizer import Tokenizer
from nmt.translator import Translator

WEIGHT_DIGITS = 4  # decimals of the attention weights in replies (the page shows the same values)


class RequestError(NMTError):
    """A request the server refuses, with the HTTP status to answer and a message saying what to send."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def rounded(weights: torch.Tensor) -> list:
    """`weights` as nested lists of floats rounded to WEIGHT_DIGITS decimals, each equal to round(w, WEIGHT_DIGITS),
    computed by torch: a float32 (or bf16) weight times 10**4 is exact in float64, rounded half to even like
    round(), and k / 10**4 is the float nearest that decimal. A loop of round() over a self-attention reply's
    160,000 weights held the interpreter lock for most of a second on a busy machine, and every other thread of
    the server (the event loop included) waited for it."""
    scale = 10.0**WEIGHT_DIGITS
    return weights.detach().to("cpu", torch.float64).mul(scale).round().div(scale).tolist()


@dataclass(frozen=True)
class Limits:
    """What one request may ask for; each bound has a command-line option in nmt-serve."""

    max_chars: int = 1000  # characters of text; longer texts are cut here (with a note)
    max_pieces: int = 100  # source pieces, EOS included; longer sources are cut (with a note)
    max_beam: int = 10
    max_body: int = 65536  # bytes of a request body
    timeout: float = 60.0  # seconds one request may take, waiting for busy models included
    max_pending: int = 16  # requests being translated at once; more are answered 503
    max_active: int = 64  # requests in progress at once, any path (the page, the API, static files); more: 503
    read_timeout: float = 10.0  # seconds a request's headers and body may take to arrive; later: 408


@dataclass
class ServedModel:
    """One loaded checkpoint: model, tokenizer, its label and settings, and the lock that serialises it."""

    index: int
    path: str
    label: str
    settings: dict
    model: Seq2Seq
    tokenizer: Tokenizer
    device: str
    amp: str = "auto"
    lock: threading.Lock = field(default_factory=threading.Lock)  # the long lane's (and translate_all's)
    short_lock: threading.Lock = field(default_factory=threading.Lock)  # the short lane's
    _translators: dict[tuple[int, int], Translator] = field(default_factory=dict)

    @property
    def has_alignment(self) -> bool:
        return bool(self.model.attention.has_alignment)

    @property
    def has_self_attention(self) -> bool:
        return bool(self.model.has_self_attention)

    def translator(self, beam: int, max_pieces: int) -> Translator:
        """A Translator for these decoding settings (they share the model; call with both locks held to make one)."""
        key = (beam, max_pieces)
        if key not in self._translators:
            self._translators[key] = Translator(
                self.model, self.tokenizer, self.device, beam_size=beam, amp=self.amp, max_src_pieces=max_pieces
            )
        return self._translators[key]

    def translate(self, text: str, beam: int, max_pieces: int, short: bool = False) -> dict:
        """The best translation of `text` as plain values (see `translate_all`), under the lock of the short lane
        or of the long one."""
        if (beam, max_pieces) not in self._translators:
            with self.lock, self.short_lock:  # Translator() moves the model to its device: not while it translates
                self.translator(beam, max_pieces)
        with self.short_lock if short else self.lock:
            start = time.perf_counter()
            n_pieces = len(self.tokenizer.encode_src([text])[0]) if text.strip() else 0
            translator = self.translator(beam, max_pieces)
            best = translator.translate([text])[0][0]
            seconds = time.perf_counter() - start
            self_attention = translator.self_attention(text) if self.has_self_attention else None
        note = None
        if n_pieces > max_pieces:
            note = (
                f"the text has {n_pieces} source pieces for this model, over the limit of {max_pieces}; "
                f"translated its first {max_pieces - 1} (and the end-of-sentence piece)"
            )
        weights = rounded(best.attention)
        return {
            "model": self.index,
            "label": self.label,
            "checkpoint": self.path,
            "hypothesis": best.text,
            "src_pieces": best.src_pieces,
            "tgt_pieces": best.tgt_pieces,
            "weights": weights,
            "self_attention": self._self_attention_reply(self_attention, len(best.src_pieces)),
            "has_alignment": self.has_alignment,
            "time": round(seconds, 4),
            "note": note,
        }

    def _self_attention_reply(self, weights: torch.Tensor | None, n_src: int) -> dict | None:
        """None without the layer, else {"layers": L, "heads": H, "weights": [layer][head][query][key]} rounded
        to WEIGHT_DIGITS, over the n_src source pieces (none for a text that encodes to no piece)."""
        if not self.has_self_attention:
            return None
        layers, heads = self.settings["self_attention_layers"], self.settings["self_attention_heads"]
        if weights is None or n_src == 0:
            return {"layers": layers, "heads": heads, "weights": [[[] for _ in range(heads)] for _ in range(layers)]}
        if tuple(weights.shape) != (layers, heads, n_src, n_src):
            raise RuntimeError(f"self-attention weights of shape {tuple(weights.shape)} for {n_src} source pieces")
        return {"layers": layers, "heads": heads, "weights": rounded(weights)}

    def describe(self) -> dict:
        """The label and settings, for GET /api/models."""
        return {
            "index": self.index,
            "label": self.label,
            "checkpoint": self.path,
            "has_alignment": self.has_alignment,
            "has_self_attention": self.has_self_attention,
            "settings": self.settings,
        }


def attention_label(model_config: dict) -> str:
    """A short name of the attention and its settings, e.g. "luong (general, current query, input feeding)";
    a checkpoint with self-attention in its encoder adds " + self-attention (2 layers, 4 heads)"."""
    name = str(model_config.get("attention", "?"))
    parts: list[str] = []
    query = model_config.get("attention_query", "current")
    if name == "none":  # previous: the vector enters every LSTM step (RNNencdec); current: after each step
        parts.append("fixed sentence vector, " + ("into every step" if query == "previous" else "after each step"))
    elif name == "bahdanau":
        parts.append("additive")
    for key, value in dict(model_config.get("attention_options") or {}).items():
        if value is None:
            continue
        if key == "score":
            parts.append(str(value))
        elif key == "heads":
            parts.append(f"{value} heads")
        elif key == "window":
            parts.append(f"window {value}")
        elif key == "hidden_size":
            parts.append(f"size {value}")
        else:
            parts.append(f"{key} {value}")
    if name != "none":
        parts.append(f"{query} query")
    parts.append("input feeding" if model_config.get("input_feeding", True) else "no input feeding")
    label = f"{name} ({', '.join(parts)})"
    layers = int(model_config.get("self_attention_layers") or 0)
    if layers:  # the encoder's, named after the decoder's attention: "... + self-attention (2 layers, 4 heads)"
        heads = model_config.get("self_attention_heads")
        label += f" + self-attention ({layers} layer{'s' * (layers != 1)}, {heads} head{'s' * (heads != 1)})"
    return label


def model_settings(payload: dict, model: Seq2Seq) -> dict:
    """What a checkpoint says about itself that helps to compare it: attention, sizes, corpus, step, BLEU."""
    config = payload.get("config") if isinstance(payload.get("config"), dict) else {}
    data = config.get("data") if isinstance(config.get("data"), dict) else {}
    best = payload.get("best") if isinstance(payload.get("best"), dict) else {}
    mc = dict(payload["model_config"])
    settings = {
        "attention": mc.get("attention"),
        "attention_query": mc.get("attention_query"),
        "attention_options": mc.get("attention_options") or {},
        "input_feeding": mc.get("input_feeding"),
        "embed_size": mc.get("embed_size"),
        "encoder_hidden_size": mc.get("encoder_hidden_size"),
        "hidden_size": mc.get("hidden_size"),
        "bidirectional": mc.get("bidirectional"),
        "self_attention_layers": int(mc.get("self_attention_layers") or 0),  # 0: none (and older checkpoints)
        "self_attention_heads": mc.get("self_attention_heads") if mc.get("self_attention_layers") else None,
        "parameters": sum(p.numel() for p in model.parameters()),
        "corpus": data.get("name"),
        "step": payload.get("step"),
    }
    if best.get("metric") and best.get("value") is not None:
        settings["best_valid"] = {"metric": best["metric"], "value": best["value"], "step": best.get("step")}
    return settings


def load_models(paths: list[str], device: str = "cpu", amp: str = "auto") -> tuple[list[ServedModel], dict]:
    """Load every checkpoint (a CheckpointError names the file that cannot be used); also the first
    checkpoint's payload, for the example sentences (nmt.serve.examples)."""
    models: list[ServedModel] = []
    first: dict = {}
    for i, path in enumerate(paths):
        payload = load_checkpoint(path)
        model, tokenizer = model_from_checkpoint(payload, device, path=path)
        if i == 0:
            first = payload
        models.append(
            ServedModel(
                i,
                str(path),
                attention_label(payload["model_config"]),
                model_settings(payload, model),
                model,
                tokenizer,
                device,
                amp,
            )
        )
    return models, first


def clean_text(text: str, limits: Limits) -> tuple[str, list[str]]:
    """`text` made safe to encode (lone surrogates become U+FFFD) and cut to max_chars; the notes to show."""
    text = text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    if not text.strip():
        raise RequestError("the text is empty; type a sentence to translate")
    notes = []
    if len(text) > limits.max_chars:
        notes.append(
            f"the text has {len(text):,} characters, over the limit of {limits.max_chars:,}; "
            f"translated its first {limits.max_chars:,}"
        )
        text = text[: limits.max_chars]
    return text, notes


def check_beam(beam: object, limits: Limits) -> int:
    """`beam` if it is a whole number from 1 to max_beam, else a RequestError saying so."""
    if isinstance(beam, bool) or not isinstance(beam, int) or not 1 <= beam <= limits.max_beam:
        shown = json.dumps(beam) if isinstance(beam, (bool, int, float, str, type(None))) else type(beam).__name__
        raise RequestError(f"beam must be a whole number from 1 (greedy) to {limits.max_beam}, not {shown[:40]}")
    return beam


def translate_all(models: list[ServedModel], text: str, beam: int, limits: Limits) -> dict:
    """Every model's best translation of `text`, one after another (nmt.serve.app runs them side by side).

    The reply: {"text": the text translated, "beam", "notes": [...], "truncated": bool, "results": [per
    model: model, label, checkpoint, hypothesis, src_pieces, tgt_pieces, weights, self_attention, has_alignment,
    time, note]}; self_attention is None without the layer, else {"layers": L, "heads": H, "weights": (L, H, S,
    S) nested lists, [layer][head][query][key], S = len(src_pieces), each query's row summing to 1}.
    """
    text, notes = clean_text(text, limits)
    beam = check_beam(beam, limits)
    results = [m.translate(text, beam, limits.max_pieces) for m in models]
    return reply(text, beam, notes, results)


def reply(text: str, beam: int, notes: list[str], results: list[dict]) -> dict:
    """The reply of POST /translate from its parts; per-model notes are added to `notes`, labelled."""
    notes = notes + [f"{r['label']}: {r['note']}" for r in results if r["note"]]
    return {"text": text, "beam": beam, "notes": notes, "truncated": bool(notes), "results": results}


def set_threads(threads: int) -> None:
    """Intra-op threads of every model call (each call may run beside others: see the module docstring)."""
    torch.set_num_threads(max(1, threads))


def short_path(path: str) -> str:
    """The last three parts of a checkpoint's path, for labels (e.g. luong/checkpoints/best.pt)."""
    parts = Path(path).parts
    return str(Path(*parts[-3:])) if len(parts) > 3 else path
