"""nmt-serve: the JSON API (every kind of bad input, limits, concurrency), start-up errors, and the page in a
real browser (headless Chromium from Debian's `chromium` package, driven by Playwright).

    python -m pytest -q tests/test_serve.py

Three tiny checkpoints of the quick preset are trained once (attention=luong, attention=none, and luong with
two layers of two-head self-attention in the encoder; sharing one data cache). The API runs in-process through
Starlette's TestClient; concurrency, the start-up errors and the browser use real `nmt-serve` processes on a
loopback address (127.0.0.2: the Host check must hold there too). Idle and slow clients and every kind of
refusal meet nmt-serve's own layers (the app and the connection layer, nmt/serve/connections.py) on 127.0.0.1
in a thread, with deadlines of a second or two.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from pathlib import Path

import httpx
import pytest
import torch

with warnings.catch_warnings():  # Starlette 1.10 prefers httpx2, which needs Python 3.11; httpx still works
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from test_serve_turns import serving  # tests/ is on sys.path (pytest's prepend import mode)

from nmt.cli.serve import bind, is_loopback
from nmt.serve.app import create_app, parse_form
from nmt.serve.connections import ConnectionLimits
from nmt.serve.examples import Examples, find_examples
from nmt.serve.guard import HEADERS, host_allowed
from nmt.serve.models import Limits, load_models, translate_all

BIN = Path(sys.executable).parent
ENV = {k: v for k, v in os.environ.items() if k not in ("NMT_DEBUG", "HYDRA_FULL_ERROR")}
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",  # --headless: Playwright's
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
LIMITS = Limits(max_chars=300, max_pieces=30, max_body=8192, timeout=30.0)
SENTENCE = "bimi raka laba nude mema"  # words of the synthetic task (data.seed=1, vocab_words=30)
SELF_ATTENTION = ("model.self_attention_layers=2", "model.self_attention_heads=2")  # the third checkpoint's encoder
LABELS = [
    "luong (general, current query, input feeding)",
    "none (fixed sentence vector, into every step, input feeding)",
    "luong (general, current query, input feeding) + self-attention (2 layers, 2 heads)",
]


def train(root: Path, attention: str, *overrides: str, name: str | None = None) -> Path:
    """A few steps of the quick preset: enough for a checkpoint that translates (badly) and attends."""
    run = root / (name or attention)
    cmd = [
        str(BIN / "nmt-train"),
        "experiment=quick",
        f"attention={attention}",
        *overrides,
        f"hydra.run.dir={run}",
        f"paths.data_dir={root / 'data'}",
        "data.train_size=1500",
        "trainer.max_steps=60",
        "trainer.valid_every=60",
        "trainer.heatmaps=0",
        "trainer.threads=1",
        "trainer.progress=false",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=root, env=ENV)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return run / "checkpoints" / "best.pt"


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("serve")
    selfattn = train(root, "luong", *SELF_ATTENTION, name="selfattn")
    return [train(root, "luong"), train(root, "none"), selfattn]


@pytest.fixture(scope="module")
def loaded(ckpts, one_thread):
    models, first = load_models([str(p) for p in ckpts], "cpu")
    return models, find_examples(first, ckpts[0])


@pytest.fixture(scope="module")
def client(loaded):
    models, examples = loaded
    with TestClient(create_app(models, examples, LIMITS)) as c:
        yield c


def post(client, body: bytes | str) -> httpx.Response:
    return client.post("/translate", content=body.encode() if isinstance(body, str) else body)


@pytest.fixture(scope="module")
def server(ckpts):
    """A real `nmt-serve` process on a free port of 127.0.0.2 (a loopback address other than the default);
    yields its base URL."""
    proc = subprocess.Popen(
        [str(BIN / "nmt-serve"), *map(str, ckpts), "--host", "127.0.0.2", "--port", "0", "--threads", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=ENV,
    )
    url, seen = None, []
    deadline = time.monotonic() + 60
    while url is None and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        found = re.search(r"serving \d+ checkpoints? on (http://\S+/)", line)
        url = found.group(1) if found else None
    assert url, "nmt-serve did not start:\n" + "".join(seen)
    assert url.startswith("http://127.0.0.2:") and not any("warning" in line for line in seen), seen  # loopback
    threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep draining its output
    yield url
    proc.terminate()  # uvicorn shuts down gracefully, then ends by the signal it got
    assert proc.wait(timeout=15) in (0, -signal.SIGTERM)


# ---------------------------------------------------------------------------------------------------- API
def test_translate_answers_for_every_checkpoint(client):
    r = post(client, json.dumps({"text": SENTENCE, "beam": 5}))
    assert r.status_code == 200, r.text
    reply = r.json()
    assert reply["text"] == SENTENCE and reply["beam"] == 5 and reply["notes"] == [] and not reply["truncated"]
    luong, none, selfattn = reply["results"]
    assert luong["label"] == LABELS[0] and luong["has_alignment"]
    assert none["label"] == LABELS[1] and not none["has_alignment"]
    assert selfattn["label"] == LABELS[2] and selfattn["has_alignment"]
    assert luong["self_attention"] is None and none["self_attention"] is None  # checkpoints without the layer
    for res in (luong, none, selfattn):
        assert res["src_pieces"][-1] == "</s>" and len(res["src_pieces"]) >= 6
        assert len(res["weights"]) == len(res["tgt_pieces"]) >= 1
        assert all(len(row) == len(res["src_pieces"]) for row in res["weights"])
        assert isinstance(res["hypothesis"], str) and res["time"] > 0 and res["note"] is None
    assert all(abs(sum(row) - 1) < 1e-3 for row in luong["weights"] + selfattn["weights"])  # over the source
    assert all(w == 0 for row in none["weights"] for w in row)


def test_the_library_gives_the_same_reply_as_the_api(client, loaded):
    api = post(client, json.dumps({"text": SENTENCE, "beam": 5})).json()
    direct = translate_all(loaded[0], SENTENCE, 5, LIMITS)
    for reply in (api, direct):
        for res in reply["results"]:
            res.pop("time")
    assert direct == api


def test_greedy_is_the_default_and_models_are_described(client):
    assert post(client, json.dumps({"text": SENTENCE})).json()["beam"] == 1
    info = client.get("/api/models").json()
    assert [m["label"] for m in info["models"]] == LABELS
    assert info["models"][0]["settings"]["attention_options"] == {"score": "general"}
    assert [m["has_self_attention"] for m in info["models"]] == [False, False, True]
    said = [(m["settings"]["self_attention_layers"], m["settings"]["self_attention_heads"]) for m in info["models"]]
    assert said == [(0, None), (0, None), (2, 2)]
    assert info["limits"]["max_pieces"] == LIMITS.max_pieces
    assert info["examples"]["source"].startswith("the test split of corpus synthetic (data cache")
    assert 1 <= len(info["examples"]["sentences"]) <= 4


BAD = [  # body, status, what the message says
    (b"", 400, "the body is empty"),
    (b"{", 400, "not valid JSON"),
    (b"\xff\xfe{}", 400, "not valid UTF-8 (byte 0xff at position 0)"),
    ('{"text": "caf\xe9"}'.encode("latin-1"), 400, "not valid UTF-8 (byte 0xe9"),
    (b"[1, 2]", 400, "must be a JSON object, not an array"),
    (b'"hello"', 400, "must be a JSON object, not a string"),
    (b'{"beam": 1}', 400, "the field text is missing"),
    (b'{"text": 5}', 400, "text must be a string, not a number"),
    (b'{"text": null}', 400, "text must be a string, not null"),
    (b'{"text": "a", "foo": 1, "Beam": 2}', 400, 'unknown field(s) "Beam", "foo"'),
    (b'{"text": "a", "beam": "5"}', 400, 'beam must be a whole number from 1 (greedy) to 10, not "5"'),
    (b'{"text": "a", "beam": 0}', 400, "not 0"),
    (b'{"text": "a", "beam": 11}', 400, "not 11"),
    (b'{"text": "a", "beam": 2.5}', 400, "not 2.5"),
    (b'{"text": "a", "beam": true}', 400, "not true"),
    (b'{"text": "   \\n\\t "}', 400, "the text is empty"),
    (b'{"text": ""}', 400, "the text is empty"),
    (b'{"text": "a", "beam": ' + b"9" * 5000 + b"}", 400, "cannot be read as JSON"),
    (b"[" * 3000, 400, "JSON"),
    (b'{"text": "' + b"a" * 9000 + b'"}', 413, "over the limit of 8,192"),
]


@pytest.mark.parametrize(("body", "status", "says"), BAD, ids=[f"{i}-{b[:12]!r}" for i, (b, _, _) in enumerate(BAD)])
def test_bad_input_is_refused_with_a_clear_message(client, body, status, says):
    r = post(client, body)
    assert r.status_code == status, r.text
    assert says in r.json()["error"]


def test_wrong_paths_and_methods_say_where_to_go(client):
    r = client.get("/translate")
    assert r.status_code == 405 and "POST /translate" in r.json()["error"]
    r = client.get("/no/such/page")
    assert r.status_code == 404 and "/api/models" in r.json()["error"]


def test_static_files_are_served_from_memory_with_an_etag(client):
    static = Path(__file__).parent.parent / "nmt" / "serve" / "static"
    for name, kind in (("serve.js", "text/javascript"), ("serve.css", "text/css"), ("favicon.svg", "image/svg+xml")):
        r = client.get(f"/static/{name}")
        assert r.status_code == 200 and r.content == (static / name).read_bytes()
        assert r.headers["content-type"].startswith(kind) and r.headers["x-content-type-options"] == "nosniff"
        again = client.get(f"/static/{name}", headers={"If-None-Match": r.headers["etag"]})
        assert again.status_code == 304 and again.content == b""
    r = client.get("/static/nope.js")
    assert r.status_code == 404 and "no such path /static/nope.js" in r.json()["error"]


def test_over_long_text_is_cut_with_a_note(client):
    words = SENTENCE.split() * 20  # 100 words, about 500 characters
    reply = post(client, json.dumps({"text": " ".join(words)})).json()
    assert reply["truncated"] and len(reply["text"]) == LIMITS.max_chars
    assert any("over the limit of 300; translated its first 300" in n for n in reply["notes"])
    for res in reply["results"]:  # then cut to max_pieces source pieces, EOS kept
        assert len(res["src_pieces"]) == LIMITS.max_pieces and res["src_pieces"][-1] == "</s>"
        assert "over the limit of 30" in res["note"]
        assert len(res["tgt_pieces"]) <= 1.5 * LIMITS.max_pieces + 10 + 1
    sa = reply["results"][2]["self_attention"]["weights"]  # over the pieces translated, as cut
    assert all(len(head) == LIMITS.max_pieces and len(head[-1]) == LIMITS.max_pieces for layer in sa for head in layer)
    page = client.post("/", data={"text": " ".join(words), "beam": "1"}).text
    assert "translated its first 300" in page and 'class="notes"' in page


def test_odd_text_never_breaks_a_reply(client):
    for text in ["\ud800 raka", "raka\x00laba", "\x00", "\u200b", "<b>raka</b> & \u202e\u05d0", "🙂 " * 20]:
        r = post(client, json.dumps({"text": text}))
        assert r.status_code == 200, r.text
        results = r.json()["results"]
        assert len(results) == 3
        sa, n = results[2]["self_attention"], len(results[2]["src_pieces"])
        assert [len(layer) for layer in sa["weights"]] == [2, 2]
        assert all(len(head) == n and all(len(row) == n for row in head) for layer in sa["weights"] for head in layer)


def test_a_failing_model_is_a_500_that_names_a_logged_id_and_the_server_goes_on(client, loaded, monkeypatch, caplog):
    def broken(*args):
        raise RuntimeError("secret detail boom")

    monkeypatch.setattr(loaded[0][1], "translate", broken)
    with caplog.at_level(logging.ERROR, logger="nmt.serve.guard"):
        r = post(client, json.dumps({"text": SENTENCE}))
        page = client.post("/", data={"text": SENTENCE, "beam": "1"})
    assert r.status_code == 500 and page.status_code == 500
    for said in (r.json()["error"], page.text):
        assert "secret" not in said and "RuntimeError" not in said
    ids = [re.search(r"internal error \(id ([0-9a-f]{8})\)", said).group(1) for said in (r.json()["error"], page.text)]
    logged = [rec for rec in caplog.records if rec.name == "nmt.serve.guard"]
    assert [rec.getMessage() for rec in logged] == [
        f"internal error {ids[0]} in POST /translate",
        f"internal error {ids[1]} in POST /",
    ]
    assert all("secret detail boom" in caplog.text and rec.exc_info for rec in logged)  # the traceback is logged
    monkeypatch.undo()
    assert post(client, json.dumps({"text": SENTENCE})).status_code == 200


def test_form_bodies_are_utf_8_whether_percent_encoded_or_not(client):
    raw = "text=größe+raka&beam=1".encode()
    assert parse_form(raw) == parse_form(b"text=gr%C3%B6%C3%9Fe+raka&beam=1") == {"text": "größe raka", "beam": "1"}
    assert parse_form(b"text=caf\xe9") == {"text": "caf\ufffd"}  # not UTF-8: U+FFFD, as nmt-translate reads it
    html = client.post("/", content=raw, headers={"Content-Type": "application/x-www-form-urlencoded"}).text
    assert ">größe raka</textarea>" in html


def test_slow_requests_time_out_and_a_full_queue_says_busy(loaded, monkeypatch):
    models, examples = loaded
    original = models[0].translate
    monkeypatch.setattr(models[0], "translate", lambda *a: (time.sleep(1.0), original(*a))[1])
    with TestClient(create_app(models, examples, Limits(timeout=0.3, max_pending=1))) as c:
        r = post(c, json.dumps({"text": SENTENCE}))
        assert r.status_code == 503 and "took longer than 0.3 s" in r.json()["error"]
        r = post(c, json.dumps({"text": SENTENCE}))  # the first is still being translated
        assert r.status_code == 503 and "busy" in r.json()["error"]
        time.sleep(1.2)
        monkeypatch.undo()
        assert post(c, json.dumps({"text": SENTENCE})).status_code == 200


def test_the_page_renders_a_heatmap_per_aligned_checkpoint(client):
    page = client.get("/")
    assert page.status_code == 200 and "default-src 'self'" in page.headers["content-security-policy"]
    assert 'name="example"' in page.text and "luong (general, current query, input feeding)" in page.text
    reply = post(client, json.dumps({"text": SENTENCE, "beam": 5})).json()
    html = client.post("/", data={"text": SENTENCE, "beam": "5"}).text
    for card, res in zip(model_cards(html), reply["results"], strict=True):
        cells = re.findall(r'class="cell" data-t="(\d+)" data-s="(\d+)" data-w="([^"]+)"', card.split("<section")[0])
        assert len(cells) == (len(res["tgt_pieces"]) * len(res["src_pieces"]) if res["has_alignment"] else 0)
        assert all(float(w) == res["weights"][int(t)][int(s)] for t, s, w in cells)
    assert html.count('<svg class="heatmap"') == 2 and "there is no alignment to show" in html  # luong, selfattn
    for card in model_cards(html)[:2]:  # checkpoints without the layer: no trace of it
        assert "self-attention" not in card and "sa-map" not in card and "attended →" not in card
        assert card.count("source →") == card.count("output ↓") == card.count("<svg")


def model_cards(html: str) -> list[str]:
    """The HTML of each checkpoint's card, in order (a card's own sections are inside its text)."""
    return re.split(r'<section class="model [a-z-]+" data-model="\d+">', html)[1:]


def sa_check(sa: dict, n: int) -> None:
    """A reply's self_attention: 2 layers x 2 heads x n queries x n keys, each query's row summing to 1."""
    assert sa["layers"] == 2 and sa["heads"] == 2 and len(sa["weights"]) == 2
    for layer in sa["weights"]:
        assert len(layer) == 2
        for head in layer:
            assert len(head) == n and all(len(row) == n for row in head)
            assert all(abs(sum(row) - 1) <= n * 0.5e-4 + 1e-9 for row in head)  # rounded to 4 decimals
            assert all(0 <= w <= 1 for row in head for w in row)


def test_the_reply_has_the_self_attention_of_every_layer_and_head(client, loaded):
    reply = post(client, json.dumps({"text": SENTENCE, "beam": 5})).json()
    res = reply["results"][2]
    sa_check(res["self_attention"], len(res["src_pieces"]))
    model = loaded[0][2]  # the same numbers as the Translator's, rounded
    with model.lock:
        direct = model.translator(5, LIMITS.max_pieces).self_attention(SENTENCE)
    assert tuple(direct.shape) == (2, 2, len(res["src_pieces"]), len(res["src_pieces"]))
    assert res["self_attention"]["weights"] == [
        [[[round(w, 4) for w in row] for row in head] for head in layer] for layer in direct.tolist()
    ]
    heads = torch.tensor(res["self_attention"]["weights"])
    assert not torch.allclose(heads[0, 0], heads[1, 1], atol=1e-3)  # the maps differ: one per layer and head
    assert list(res) == list(reply["results"][0])  # every result has the same fields, in the same order


def test_the_page_has_a_self_attention_map_per_layer_and_head_and_the_selectors(client):
    reply = post(client, json.dumps({"text": SENTENCE, "beam": 1})).json()
    res = reply["results"][2]
    S = len(res["src_pieces"])
    card = model_cards(client.post("/", data={"text": SENTENCE, "beam": "1"}).text)[2]
    section = card[card.index('<section class="self-attention"') :]
    section = section[: section.index("</section>")]
    assert "<h3>Self-attention over the source</h3>" in section
    assert '<div class="sa-controls" hidden>' in section  # the script shows the selectors; without it, all maps
    for name in ("layer", "head"):
        label = f'<label for="sa-{name}-2">{name.capitalize()}</label>'
        assert f'{label} <select id="sa-{name}-2" class="sa-{name}">' in section
    assert re.findall(r'<option value="(\d)">\1</option>', section) == ["1", "2", "1", "2"]
    figures = re.findall(r'<figure class="sa-map" data-layer="(\d)" data-head="(\d)"><figcaption>([^<]*)<', section)
    assert figures == [(lay, hd, f"layer {lay}, head {hd}") for lay in "12" for hd in "12"]
    assert " hidden" not in section.split("sa-maps")[1]  # every map is shown without JavaScript
    maps = section.split('<figure class="sa-map"')[1:]
    for (lay, hd, _), svg in zip(figures, maps, strict=True):
        assert f'data-kind="self" data-layer="{lay}" data-head="{hd}"' in svg
        assert "attended →" in svg and "query ↓" in svg and "source →" not in svg
        assert f'id="blues-2-{lay}-{hd}"' in svg and f'fill="url(#blues-2-{lay}-{hd})"' in svg  # its own gradient
        cells = re.findall(r'class="cell" data-t="(\d+)" data-s="(\d+)" data-w="([^"]+)"', svg)
        assert len(cells) == S * S
        weights = res["self_attention"]["weights"][int(lay) - 1][int(hd) - 1]
        assert all(float(w) == weights[int(t)][int(s)] for t, s, w in cells)
        t, s = 1, 2
        title = f"query {res['src_pieces'][t]} · attends {res['src_pieces'][s]} · weight {weights[t][s]:.3f}"
        assert f"<title>{title}</title>" in svg


def test_the_page_escapes_text_and_shows_errors(client):
    html = client.post("/", data={"text": "<script>alert(1)</script> raka", "beam": "1"}).text
    assert "<script>alert" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    r = client.post("/", data={"text": "  ", "beam": "1"})
    assert r.status_code == 400 and 'class="error"' in r.text and "the text is empty" in r.text
    r = client.post("/", data={"text": "raka", "beam": "7"})
    assert r.status_code == 400 and "beam must be 1 (greedy) or 5" in r.text
    example = client.get("/api/models").json()["examples"]["sentences"][0]
    html = client.post("/", data={"text": "", "beam": "1", "example": example}).text
    assert 'class="cell"' in html and f">{example}</textarea>" in html


def test_examples_fall_back_from_the_cache_to_a_regenerated_corpus_to_a_built_in_list(ckpts):
    payload = torch.load(ckpts[0], weights_only=True)
    cached = find_examples(payload, ckpts[0])
    assert "data cache" in cached.source and len(cached.sentences) == 4
    assert len(set(cached.sentences)) == 4 and all(len(s.split()) <= 25 for s in cached.sentences)
    payload["config"]["paths"]["data_dir"] = "/nonexistent"
    assert find_examples(payload, ckpts[0]) == Examples(
        cached.sentences, "the test split of the synthetic task (regenerated from the checkpoint's config)"
    )
    payload["config"]["data"] = {"name": "bible", "source_translation": "e", "target_translation": "k"}
    built_in = find_examples(payload, ckpts[0])
    assert built_in.sentences[0].startswith("Im Anfang") and built_in.source.startswith("built-in German")
    payload["config"]["data"] = {"name": "files", "src_lang": "xx"}
    assert find_examples(payload, ckpts[0]).sentences == []


# --------------------------------------------------------------------------------------- real processes
def test_concurrent_requests_each_get_their_own_answer(server):
    texts = [" ".join(SENTENCE.split()[: 1 + i % 5] * (1 + i // 5)) for i in range(12)]
    jobs = [(t, 1 + 4 * (i % 2)) for i, t in enumerate(texts)]

    def ask(job):
        r = httpx.post(server + "translate", json={"text": job[0], "beam": job[1]}, timeout=60)
        assert r.status_code == 200, r.text
        return [{k: v for k, v in res.items() if k != "time"} for res in r.json()["results"]], r.json()["text"]

    alone = [ask(job) for job in jobs]
    with ThreadPoolExecutor(6) as pool:
        together = list(pool.map(ask, jobs))
    assert [text for _, text in together] == texts
    assert together == alone


def test_only_loopback_host_names_are_served(server):
    port = server.rsplit(":", 1)[1].strip("/")
    for host in (f"127.0.0.2:{port}", f"localhost:{port}", f"127.0.0.1:{port}", "[::1]"):
        assert httpx.get(server + "api/models", headers={"Host": host}).status_code == 200, host
    strict = ("localhost:evil", "[::1]evil", "[127.0.0.1]", "::1", f"127.0.0.2:{port}:{port}")  # Host parsed strictly
    for host in ("evil.example", f"evil.example:{port}", "127.0.0.2.evil.example", "10.0.0.1", *strict):
        r = httpx.get(server + "api/models", headers={"Host": host})
        assert_refusal(r.status_code, r.headers, r.text, 400, f"DNS rebinding); open {server}")


HOSTS = [
    ("127.0.0.1:8000", True),
    ("127.0.0.2", True),
    ("127.255.0.9:80", True),
    ("[::1]:8000", True),
    ("::1", False),  # an IPv6 address needs its brackets
    ("localhost", True),
    ("LocalHost.:8000", True),
    ("app.localhost", True),
    ("myname:8000", True),  # --host myname (it resolved to loopback)
    ("evil.example", False),
    ("127.0.0.1.evil.example", False),
    ("localhost.evil.example", False),
    ("10.0.0.1", False),
    ("[::2]", False),
    ("", False),
    ("localhost:evil", False),  # a port is digits
    ("localhost:", True),  # an empty port is allowed (RFC 3986)
    ("[::1]evil", False),
    ("[127.0.0.1]", False),  # brackets hold an IPv6 address
    ("127.0.0.1:80:80", False),
    ("local host", False),
]


@pytest.mark.parametrize(("host", "allowed"), HOSTS)
def test_the_host_check_goes_by_address_and_never_resolves_the_header(host, allowed):
    assert host_allowed(host, frozenset({"myname"})) is allowed


def test_loopback_is_decided_by_the_address_the_host_resolves_to():
    for host, loopback in (("127.0.0.2", True), ("localhost", True), ("0.0.0.0", False)):
        with bind(host, 0) as sock:
            assert is_loopback(sock) is loopback, host


def serve_fails(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(BIN / "nmt-serve"), *args], capture_output=True, text=True, timeout=60, env=ENV)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("nmt-serve: error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc


def test_start_up_errors_are_one_line(ckpts, tmp_path):
    missing = serve_fails(str(tmp_path / "nope.pt"), "--port", "0").stderr
    assert f"{tmp_path / 'nope.pt'}: no such checkpoint; pass the path of a .pt file" in missing
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(ckpts[0].read_bytes()[:5000])
    said = serve_fails(str(ckpts[0]), str(corrupt), "--port", "0").stderr  # the second one is named
    assert f"{corrupt}: truncated or corrupt checkpoint" in said and "copy it again" in said
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = str(taken.getsockname()[1])
        said = serve_fails(str(ckpts[0]), "--port", port).stderr
    assert f"127.0.0.1:{port} is already in use" in said and "--port 0 picks a free one" in said
    bad = subprocess.run([str(BIN / "nmt-serve"), str(ckpts[0]), "--port", "70000"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--port 70000" in bad.stderr
    helped = subprocess.run([str(BIN / "nmt-serve"), "--help"], capture_output=True, text=True)
    assert helped.returncode == 0 and "POST /translate" in helped.stdout and "--max-pieces" in helped.stdout
    options = ("read-timeout", "idle-timeout", "write-timeout", "max-connections")
    assert all(f"--{option}" in helped.stdout for option in options)


def test_two_servers_started_at_once_on_one_port_one_says_so_in_a_line(ckpts):
    """Two nmt-serve on one port, the second started within 2 s of the first: both can bind it (Linux lets two
    sockets with SO_REUSEADDR bind one port while neither listens): the second says so in one line before loading
    its models, not with a traceback from listen() after."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = str(free.getsockname()[1])
    cmd = [str(BIN / "nmt-serve"), str(ckpts[0]), "--port", port, "--threads", "1"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV) for _ in "ab"]
    try:
        deadline = time.monotonic() + 60
        while all(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.05)
        failed = [p for p in procs if p.poll() is not None]
        assert len(failed) == 1, "neither failed"
        out, err = failed[0].communicate(timeout=10)
        assert failed[0].returncode == 2 and err.count("\n") == 1 and "Traceback" not in err, err
        assert err.startswith(f"nmt-serve: error: 127.0.0.1:{port} is already in use") and "--port 0" in err
        assert "parameters" not in out  # answered before loading any model
        serving = next(p for p in procs if p is not failed[0])
        line = serving.stdout.readline()
        while line and "serving" not in line:
            line = serving.stdout.readline()
        assert f"on http://127.0.0.1:{port}/" in line
        assert httpx.get(f"http://127.0.0.1:{port}/api/models", timeout=10).status_code == 200
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=15)


@contextmanager
def chromium_page() -> Iterator:
    """A page of headless Debian Chromium (driven by Playwright) in a fresh profile, 1300 x 900."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw, tempfile.TemporaryDirectory() as profile:
        browser = pw.chromium.launch_persistent_context(
            profile,
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1300, "height": 900},
        )
        try:
            yield browser.new_page()
        finally:
            browser.close()


@pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="needs Debian's chromium at /usr/bin/chromium (apt-get install -y chromium; .ci/run installs it)",
)
def test_the_page_in_a_real_browser(server, tmp_path):
    api = httpx.post(server + "translate", json={"text": SENTENCE, "beam": 1}, timeout=60).json()["results"][0]
    outside, errors = [], []
    with chromium_page() as page:
        page.on("request", lambda req: req.url.startswith(server) or outside.append(req.url))
        page.on("console", lambda msg: msg.type == "error" and errors.append(msg.text))
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(server)
        page.fill("#text", SENTENCE)
        page.click("#translate")
        page.wait_for_selector("svg.heatmap rect.cell")
        cards = page.locator("section.model")
        assert cards.count() == 3
        assert "no alignment to show" in cards.nth(1).inner_text() and cards.nth(1).locator("svg").count() == 0
        cells = cards.nth(0).locator("rect.cell")
        assert cells.count() == len(api["tgt_pieces"]) * len(api["src_pieces"])
        shown = cells.evaluate_all("cs => cs.map(c => [+c.dataset.t, +c.dataset.s, +c.dataset.w])")
        assert all(w == api["weights"][t][s] for t, s, w in shown)
        assert cards.nth(0).locator(".hyp").inner_text() == (api["hypothesis"] or "(empty output)")
        cells.nth(0).hover()  # the tooltip names the source piece, the output piece and the weight
        tip = page.locator("#tip").inner_text()
        assert f"source {api['src_pieces'][0]}" in tip and f"output {api['tgt_pieces'][0]}" in tip
        assert f"weight {api['weights'][0][0]:.3f}" in tip
        cards.nth(0).locator("text.tgt").nth(0).hover()  # an output piece: its source weights light up
        assert page.locator(".readout").first.inner_text().startswith(f"output {api['tgt_pieces'][0]} attends to")
        assert cards.nth(0).locator("rect.srcbg[style*='fill-opacity']").count() == len(api["src_pieces"])
        shot = tmp_path / "serve.png"
        page.screenshot(path=str(shot), full_page=True)
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    assert outside == [] and errors == []


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium")
def test_the_self_attention_selectors_in_a_real_browser(server, tmp_path):
    api = httpx.post(server + "translate", json={"text": SENTENCE, "beam": 1}, timeout=60).json()["results"][2]
    src, sa = api["src_pieces"], api["self_attention"]["weights"]
    errors = []
    with chromium_page() as page:
        page.on("console", lambda msg: msg.type == "error" and errors.append(msg.text))
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(server)
        page.fill("#text", SENTENCE)
        with page.expect_navigation():
            page.click("#translate")
        section = page.locator("section.model").nth(2).locator("section.self-attention")
        assert page.locator("section.self-attention").count() == 1  # only the checkpoint with the layer
        assert section.locator(".sa-controls").is_visible()
        for name in ("Layer", "Head"):  # real <select>s, named by their labels
            assert section.get_by_label(name, exact=True).evaluate("e => e.tagName") == "SELECT"
            assert section.get_by_label(name, exact=True).is_visible()
        maps = section.locator("figure.sa-map")
        assert maps.count() == 4

        def visible() -> list[tuple[str, str]]:
            return [(m.get_attribute("data-layer"), m.get_attribute("data-head")) for m in maps.all() if m.is_visible()]

        assert visible() == [("1", "1")]  # the first layer's first head, until another is chosen
        section.locator("select.sa-layer").select_option("2")
        section.locator("select.sa-head").select_option("2")
        assert visible() == [("2", "2")]
        section.locator("select.sa-head").select_option("1")
        assert visible() == [("2", "1")]
        shown = section.locator('figure.sa-map[data-layer="2"][data-head="1"]')
        assert shown.locator("figcaption").inner_text() == "layer 2, head 1"
        assert shown.locator("svg").get_attribute("data-layer") == "2"
        cells = shown.locator("rect.cell")
        assert cells.count() == len(src) ** 2
        t, s = 1, 0
        shown.locator(f'rect.cell[data-t="{t}"][data-s="{s}"]').hover()
        said = f"query {src[t]} · attends {src[s]} · weight {sa[1][0][t][s]:.3f}"
        assert page.locator("#tip").is_visible() and page.locator("#tip").inner_text() == said
        assert section.locator(".readout").inner_text() == said  # the section's own readout
        assert page.locator("section.model").nth(2).locator(".readout").first.inner_text().startswith("Hover")
        shown.locator("text.tgt").nth(t).hover()  # a query piece: the pieces it attends to light up
        assert section.locator(".readout").inner_text().startswith(f"query {src[t]} attends to")
        shown.locator(f'rect.cell[data-t="{t}"][data-s="{s}"]').hover()
        shot = tmp_path / "serve_selfattn.png"
        page.screenshot(path=str(shot), full_page=True)
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
        section.screenshot(path=str(tmp_path / "serve_selfattn_section.png"))
        if os.environ.get("NMT_SERVE_SHOTS"):  # a copy to look at: NMT_SERVE_SHOTS=/tmp/serve_selfattn.png
            Path(os.environ["NMT_SERVE_SHOTS"]).write_bytes(shot.read_bytes())
    assert errors == []


# ------------------------------------------------------------------------------ idle and slow clients, refusals
@contextmanager
def real_server(loaded, limits: Limits = LIMITS, **connections) -> Iterator[tuple[str, int, object]]:
    """nmt-serve's layers (the app with the Host check of a loopback server, the connection layer with
    ConnectionLimits(**connections)) on a free port of 127.0.0.1, in a thread; yields (URL, port, uvicorn server)."""
    models, examples = loaded
    app = create_app(models, examples, limits, allowed_hosts=[])
    with serving(app, ConnectionLimits(**connections)) as (port, server):
        yield f"http://127.0.0.1:{port}/", port, server


def open_sending(port: int, data: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    if data:
        sock.sendall(data)
    return sock


def until_closed(socks: list[socket.socket], limit: float) -> dict[socket.socket, tuple[float, bytes]]:
    """For each socket, (seconds from now until the server closed it, all it sent); fails after `limit` s."""
    start, got, done = time.monotonic(), {s: b"" for s in socks}, {}
    with selectors.DefaultSelector() as sel:
        for s in socks:
            sel.register(s, selectors.EVENT_READ)
        while len(done) < len(socks) and time.monotonic() - start < limit:
            for key, _ in sel.select(timeout=0.05):
                s = key.fileobj
                try:
                    data = s.recv(65536)
                except OSError:
                    data = b""
                got[s] += data
                if not data:
                    done[s] = (time.monotonic() - start, got[s])
                    sel.unregister(s)
    assert len(done) == len(socks), f"{len(socks) - len(done)} connections still open after {limit} s"
    return done


def parse_reply(raw: bytes) -> tuple[int, dict[str, str], str]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body.decode()


def assert_refusal(status: int, headers, body: str, expected: int, says: str) -> None:
    """The documented refusal: {"error": ...} as application/json, with the page's security headers."""
    assert status == expected, body
    assert headers["content-type"] == "application/json"
    assert all(headers[name.lower()] == value for name, value in HEADERS.items()), headers
    assert says in json.loads(body)["error"], body


def raw_refusal(port: int, data: bytes, expected: int, says: str, within: float = 5) -> float:
    """Send `data` on a new connection: the server answers `expected` in JSON and closes; returns the seconds."""
    with open_sending(port, data) as sock:
        seconds, raw = until_closed([sock], within)[sock]
    assert_refusal(*parse_reply(raw), expected, says)
    assert parse_reply(raw)[1]["connection"] == "close"
    return seconds


def test_idle_and_half_sent_connections_do_not_lock_others_out(loaded):
    idle_s, read_s = 1.5, 2.5
    with real_server(loaded, idle_timeout=idle_s, read_timeout=read_s, max_connections=200) as (url, port, server):
        idle = [open_sending(port) for _ in range(100)]
        half = [open_sending(port, b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-") for _ in range(20)]
        opened = time.monotonic()
        r = httpx.get(url + "api/models", timeout=5)
        assert r.status_code == 200 and time.monotonic() - opened < 1
        r = httpx.post(url + "translate", json={"text": SENTENCE}, timeout=10)
        assert r.status_code == 200 and len(r.json()["results"]) == 3
        assert len(server.server_state.connections) >= 120  # they were all open meanwhile
        waited = time.monotonic() - opened
        closed = until_closed(idle + half, read_s + 3)
    for s in idle:  # closed in silence at the idle deadline
        seconds, said = closed[s]
        assert said == b"" and idle_s - 0.3 <= waited + seconds <= idle_s + 1.5
        s.close()
    for s in half:  # 408 at the read deadline, from the first byte
        seconds, said = closed[s]
        assert read_s - 0.3 <= waited + seconds <= read_s + 1.5
        assert_refusal(*parse_reply(said), 408, f"took longer than {read_s:g} s to arrive")
        s.close()


def test_past_max_connections_the_longest_idle_are_closed_and_requests_in_progress_kept(loaded, monkeypatch):
    models = loaded[0]
    original = models[0].translate
    monkeypatch.setattr(models[0], "translate", lambda *a: (time.sleep(0.8), original(*a))[1])
    with real_server(loaded, max_connections=20, idle_timeout=10, read_timeout=10) as (url, port, server):
        with ThreadPoolExecutor(1) as pool:
            slow = pool.submit(httpx.post, url + "translate", json={"text": SENTENCE}, timeout=10)
            while not server.server_state.tasks:  # the slow request is in progress
                time.sleep(0.01)
            idle = [open_sending(port) for _ in range(40)]
            time.sleep(0.2)
            live = [c for c in server.server_state.connections if not c.transport.is_closing()]
            assert len(live) <= 20
            closed = until_closed(idle[:20], 2)  # the oldest went at once, long before their idle deadline
            assert all(said == b"" and seconds < 2 for seconds, said in closed.values())
            assert slow.result().status_code == 200
            r = httpx.get(url + "api/models", timeout=5)
            assert r.status_code == 200
        for s in idle:
            s.close()


STATIC = b"GET /static/serve.js HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"  # a reply of about 6 KB


def pipelining(port: int, request: bytes, copies: int) -> socket.socket:
    """A connection that sends `copies` requests at once (pipelined) and, with a small receive buffer, soon has
    more replies coming than it has read."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
    sock.connect(("127.0.0.1", port))

    def send() -> None:
        with suppress(OSError):  # the server cuts the connection before it has taken every request
            sock.sendall(request * copies)

    threading.Thread(target=send, daemon=True).start()
    return sock


def trickle(socks: list[socket.socket], cut: dict, got: dict) -> None:
    """Read 4 KB from each socket every 50 ms (about 80 KB/s, slower than the server writes) until it is cut."""
    while len(cut) < len(socks):
        for s in socks:
            if s in cut:
                continue
            try:
                data = s.recv(4096)
            except OSError:
                data = b""
            got[s] = got.get(s, 0) + len(data)
            if not data:
                cut[s] = time.monotonic()
        time.sleep(0.05)


def test_slow_readers_hold_no_place_and_are_cut_at_the_send_deadline(loaded):
    """A connection that pipelines requests and does not read holds no place of max_active while its replies wait
    (66 of them must not answer others 503), and its send deadline does not restart when a slow reader reads a
    little, so slow readers are cut."""
    write_s = 1.5
    one = dataclasses.replace(LIMITS, max_active=1)
    with real_server(loaded, one, write_timeout=write_s, idle_timeout=10) as (url, port, server):

        def backed_up(n: int) -> float:  # seconds until n connections have replies waiting (the kernel's are full)
            began = time.monotonic()
            while sum(c.unread_since is not None for c in list(server.server_state.connections)) < n:
                if time.monotonic() - began > 30:  # (seconds if the kernel took 4 MiB first)
                    break
                time.sleep(0.02)
            return time.monotonic() - began

        began = time.monotonic()
        never = [pipelining(port, b"GET /api/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 6000)]
        waited = backed_up(1)
        for _ in range(3):  # the one place is free for another client, answered at once
            asked = time.monotonic()
            r = httpx.get(url + "api/models", timeout=5)
            assert r.status_code == 200 and time.monotonic() - asked < 1, r.text
        r = httpx.post(url + "translate", json={"text": SENTENCE}, timeout=10)
        assert r.status_code == 200 and len(r.json()["results"]) == 3, r.text
        assert waited < write_s  # the kernel holds 256 KiB of a connection's replies, not megabytes

        slow, cut, got = [pipelining(port, STATIC, 2000) for _ in range(2)], {}, {}
        reader = threading.Thread(target=trickle, args=(slow, cut, got), daemon=True)
        reader.start()
        opened = time.monotonic()
        while server.server_state.connections and time.monotonic() - opened < write_s + 4:
            time.sleep(0.05)
        assert not server.server_state.connections, "slow readers were not cut"
        reader.join(5)
    assert time.monotonic() - began < 2 * write_s + 5
    assert len(cut) == 2 and all(at - opened >= write_s for at in cut.values())  # not before the deadline
    assert all(got[s] > 64 * 1024 for s in slow), got  # they read through several stalls, none restarted it
    for s in never + slow:
        s.close()


def test_a_burst_past_max_connections_is_answered_503_never_reset(loaded):
    """Connections that arrive in one burst, each with a whole request, are not closed to make room before their
    requests are read (the client would see a reset): each gets an answer, 503 past the cap."""
    cap = 8
    with real_server(loaded, max_connections=cap, idle_timeout=10, read_timeout=10) as (url, port, server):
        loop = server.servers[0].get_loop()
        loop.call_soon_threadsafe(time.sleep, 1.0)  # the server is busy a moment, as under load: a burst queues
        time.sleep(0.1)
        request = b"GET /api/models HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        burst = [open_sending(port, request) for _ in range(3 * cap)]
        closed = until_closed(burst, 10)
    replies = [parse_reply(said) if said else (None, {}, "") for _, said in closed.values()]
    assert sorted(str(status) for status, _, _ in replies) == ["200"] * cap + ["503"] * (2 * cap)
    for status, headers, body in replies:
        if status == 503:
            assert_refusal(status, headers, body, 503, "too many connections")
            assert headers["connection"] == "close"
    for s in burst:
        s.close()


def test_the_header_limit_holds_however_the_bytes_arrive(loaded):
    """60,000 bytes of headers in one write are refused 431 as in pieces (h11 limits only a head in pieces)."""
    head = b"GET /api/models HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nX: "
    with real_server(loaded) as (url, port, server):
        for padded in (b"a" * 60000, b" " * 60000 + b"a", b"a" * 17000):  # whitespace h11 strips counts too
            raw_refusal(port, head + padded + b"\r\n\r\n", 431, "over 16,384 bytes")
        with open_sending(port, head + b"a" * 16000 + b"\r\n\r\n") as sock:  # just under the limit: served
            assert parse_reply(until_closed([sock], 5)[sock][1])[0] == 200


def test_content_length_with_transfer_encoding_is_read_by_the_latter_answered_and_closed(loaded):
    """A request with both is answered and its connection closed, as RFC 9112 (6.3) says."""
    body = json.dumps({"text": SENTENCE}).encode()
    request = (
        b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
        + b"GET /api/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"  # smuggled behind it: never answered
    )
    with real_server(loaded, idle_timeout=10) as (url, port, server):
        with open_sending(port, request) as sock:
            seconds, said = until_closed([sock], 5)[sock]
    status, headers, text = parse_reply(said)
    assert status == 200 and headers["connection"] == "close" and seconds < 5
    assert json.loads(text)["text"] == SENTENCE and said.count(b"HTTP/1.1 ") == 1


def test_absolute_form_targets_and_http_1_0_without_host_are_served(loaded):
    """GET http://host/path is served as GET /path, not "no such path"; HTTP/1.0 without a Host header is served."""
    with real_server(loaded) as (url, port, server):

        def ask(request: bytes) -> tuple[int, dict[str, str], str]:
            with open_sending(port, request) as sock:
                return parse_reply(until_closed([sock], 5)[sock][1])

        close = b"Host: 127.0.0.1\r\nConnection: close\r\n\r\n"
        status, _, text = ask(b"GET http://127.0.0.1:%d/api/models?x=1 HTTP/1.1\r\n%s" % (port, close))
        assert status == 200 and "models" in json.loads(text)
        # the target's host is the one checked (RFC 9112, 3.2.2), whatever the Host header says
        assert_refusal(*ask(b"GET http://evil.example/api/models HTTP/1.1\r\n" + close), 400, "DNS rebinding")
        status, _, text = ask(b"GET /api/models HTTP/1.0\r\n\r\n")
        assert status == 200 and "models" in json.loads(text)
        assert_refusal(*ask(b"GET /api/models HTTP/1.0\r\nHost: evil.example\r\n\r\n"), 400, "DNS rebinding")


def test_every_refusal_is_json_with_the_security_headers(loaded, monkeypatch, caplog):
    slow_app = dataclasses.replace(LIMITS, read_timeout=0.5)  # the app's own body deadline comes first here
    with real_server(loaded, slow_app, read_timeout=1.5, idle_timeout=5) as (url, port, server):
        r = httpx.get(url + "api/models", headers={"Host": "evil.example"})
        assert_refusal(r.status_code, r.headers, r.text, 400, "DNS rebinding")
        r = httpx.get(url + "no/such/page")
        assert_refusal(r.status_code, r.headers, r.text, 404, "no such path /no/such/page")
        r = httpx.get(url + "translate")
        assert_refusal(r.status_code, r.headers, r.text, 405, "POST /translate")
        assert r.headers.get("connection") != "close"
        raw_refusal(port, b"GARBAGE\r\n\r\n", 400, "malformed HTTP request")
        raw_refusal(port, b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX: " + b"a" * 20000, 431, "over 16,384 bytes")
        post = b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n"
        raw_refusal(port, post % 9000 + b"{", 413, "over the limit of 8,192")  # and closed: the rest is not read
        # 408 from the connection layer (headers not in after 1.5 s), and from the app (a body not in after 0.5 s);
        # both close the connection, so nothing more is read from it
        assert 1.3 < raw_refusal(port, b"GET / HTTP/1.1\r\nHost: 127.0.0.1", 408, "longer than 1.5 s") < 3
        assert 0.3 < raw_refusal(port, post % 40 + b'{"text": ', 408, "longer than 0.5 s") < 1.3
        # 500: an id, logged with the traceback; never the exception's text
        monkeypatch.setattr(loaded[0][0], "translate", lambda *a: 1 / 0)
        with caplog.at_level(logging.ERROR, logger="nmt.serve.guard"):
            r = httpx.post(url + "translate", json={"text": SENTENCE})
        assert_refusal(r.status_code, r.headers, r.text, 500, "internal error (id ")
        assert "division" not in r.text and "ZeroDivisionError" not in r.text
        ident = re.search(r"id ([0-9a-f]{8})", r.text).group(1)
        assert f"internal error {ident} in POST /translate" in caplog.text and "ZeroDivisionError" in caplog.text
        monkeypatch.undo()
        assert httpx.post(url + "translate", json={"text": SENTENCE}).status_code == 200

    # 503: past max_active requests in progress (the app), and with every connection holding one (the layer)
    original = loaded[0][0].translate
    monkeypatch.setattr(loaded[0][0], "translate", lambda *a: (time.sleep(0.6), original(*a))[1])
    with ThreadPoolExecutor(2) as pool:
        with real_server(loaded, dataclasses.replace(LIMITS, max_active=1)) as (url, port, server):
            slow = pool.submit(httpx.post, url + "translate", json={"text": SENTENCE}, timeout=10)
            while not server.server_state.tasks:
                time.sleep(0.01)
            time.sleep(0.1)
            r = httpx.post(url + "translate", json={"text": SENTENCE}, timeout=5)
            assert_refusal(r.status_code, r.headers, r.text, 503, "busy: 1 requests are in progress")
            assert slow.result().status_code == 200
        with real_server(loaded, max_connections=2) as (url, port, server):
            slow = [pool.submit(httpx.post, url + "translate", json={"text": SENTENCE}, timeout=10) for _ in range(2)]
            while len(server.server_state.tasks) < 2:
                time.sleep(0.01)
            time.sleep(0.1)
            raw_refusal(port, b"GET /api/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 503, "too many connections")
            assert [s.result().status_code for s in slow] == [200, 200]


def test_a_long_page_is_drawn_off_the_event_loop_within_its_bound_and_streamed(loaded, monkeypatch):
    """A self-attention checkpoint's page (34 MB at 100 pieces, 2 layers x 8 heads, drawn whole) is drawn off the
    event loop within a size bound and streamed, so other requests do not wait on it and clients that never read
    it hold little."""
    import nmt.serve.heatmap as heatmap

    drawing, geometry = threading.Event(), heatmap._geometry

    def slow_geometry(*args):  # each map takes 0.25 s more to draw (a sleep: it holds no lock)
        drawing.set()
        time.sleep(0.25)
        return geometry(*args)

    monkeypatch.setattr(heatmap, "_geometry", slow_geometry)
    long = dataclasses.replace(LIMITS, max_chars=1000, max_pieces=100)
    text = " ".join(SENTENCE.split() * 30)  # 150 words: cut to 100 pieces
    with real_server(loaded, long) as (url, port, server), ThreadPoolExecutor(1) as pool:
        page = pool.submit(httpx.post, url, data={"text": text, "beam": "1"}, timeout=60)
        assert drawing.wait(60)
        for _ in range(3):  # while the page's six maps are drawn (1.5 s), other requests are answered at once
            asked = time.monotonic()
            assert httpx.get(url + "api/models", timeout=10).status_code == 200
            assert time.monotonic() - asked < 0.5
        r = page.result()
        monkeypatch.undo()
        api = httpx.post(url + "translate", json={"text": text, "beam": 1}, timeout=60).json()["results"]
    from nmt.serve.bounds import MAP_CELLS, SELF_ATTENTION_CELLS

    assert r.status_code == 200 and r.headers["transfer-encoding"] == "chunked"  # sent as it is drawn
    assert r.text.endswith("</html>\n") and len(r.content) < 4_000_000
    card = model_cards(r.text)[2]
    S = len(api[2]["src_pieces"])
    assert S == 100 and api[2]["note"]  # cut to 100 pieces: 4 maps of 10,000 cells in full
    maps = card[card.index('<section class="self-attention"') :].split('<figure class="sa-map"')[1:]
    assert len(maps) == 4 and "drawn coarser to keep the page small" in card and "POST /translate gives" in card
    g = int(re.search(r'data-group="(\d+)"', maps[0]).group(1))
    n = -(-S // g)
    assert g > 1 and 4 * n * n <= SELF_ATTENTION_CELLS < 4 * (-(-S // (g - 1))) ** 2  # the finest that fits
    full = api[2]["self_attention"]["weights"][0][0]  # layer 1, head 1: each cell is its block's mean row sum
    cells = re.findall(r'class="cell" data-t="(\d+)" data-s="(\d+)" data-w="([^"]+)"', maps[0])
    assert len(cells) == n * n
    for t, s, w in cells:
        rows = full[int(t) * g : int(t) * g + g]
        assert abs(float(w) - sum(sum(row[int(s) * g : int(s) * g + g]) for row in rows) / len(rows)) < 1e-3
    cross = re.findall(r'class="cell" data-t', card.split('<section class="self-attention"')[0])
    assert 0 < len(cross) <= MAP_CELLS


def test_a_body_in_tiny_chunks_is_refused_before_it_costs_more_than_one_with_content_length(loaded):
    """A body in 1-byte chunks costs the event loop far more than the same body with Content-Length (h11 parses
    each chunk in Python; 4 such clients held every other request up by seconds), so too many chunks are refused."""
    head = b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    body = json.dumps({"text": SENTENCE}).encode()[:-1] + b" " * 8000 + b"}"  # under LIMITS.max_body

    def chunked(size: int) -> bytes:
        pieces = [body[i : i + size] for i in range(0, len(body), size)]
        return head + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"

    with real_server(loaded, read_timeout=1.5, idle_timeout=10) as (url, port, server):
        assert raw_refusal(port, chunked(1), 400, "the chunked body came in more than 256 chunks") < 1
        with open_sending(port, chunked(len(body) // 200 + 1)) as sock:  # 200 chunks: served
            status, _, text = parse_reply(until_closed([sock], 10)[sock][1])
        assert status == 200 and json.loads(text)["text"].startswith(SENTENCE)
        # the read deadline holds for a chunked body as for one with Content-Length: 408 from the first byte
        assert 1.3 < raw_refusal(port, head + b'5\r\n{"tex\r\n', 408, "longer than 1.5 s") < 3


def test_at_the_cap_the_connection_leaving_its_replies_unread_longest_is_cut(loaded):
    """Connections that pipeline requests and never read are not idle, yet at max_connections a newcomer must not
    get 503 until their send deadline, or 300 that reconnect hold the cap (every local client shares 127.0.0.1,
    so a bound by address would not help): the one that left its replies unread longest is cut."""
    cap = 5
    limits = {"max_connections": cap, "write_timeout": 30, "idle_timeout": 30, "read_timeout": 30}
    with real_server(loaded, **limits) as (url, port, server):

        def stalled() -> int:  # connections whose send deadline runs: replies backed up, unread
            return sum(c.unread_since is not None for c in list(server.server_state.connections))

        never = []
        for i in range(cap):  # one after another: each one's replies back up before the next opens
            never.append(pipelining(port, STATIC, 2000))
            began = time.monotonic()
            while stalled() <= i and time.monotonic() - began < 10:
                time.sleep(0.02)
        assert stalled() == cap
        asked = time.monotonic()
        r = httpx.get(url + "api/models", timeout=10)
        assert r.status_code == 200 and time.monotonic() - asked < 2, r.text
        until_closed(never[:1], 5)  # the first, unread longest, was cut to make room
        state = [s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] for s in never[1:]]
        assert state == [1] * (cap - 1)  # TCP_ESTABLISHED: the others are left to their send deadline
    for s in never:
        s.close()


def test_a_short_request_is_answered_while_long_ones_are_translated(loaded, monkeypatch):
    """Under six clients asking for 150-word pages a translation in progress is never interrupted, so a three-word
    request in one lane waits for the long ones ahead of it (seconds on a busy machine). Short requests have a lane
    of their own (nmt/serve/lanes.py)."""
    models, _ = loaded
    started = threading.Event()

    def slow_when_long(original):
        def translate(text, *args):
            if len(text) > 200:  # a long request: its model is busy for 3 s (a sleep: it holds no lock)
                started.set()
                time.sleep(3)
            return original(text, *args)

        return translate

    for m in models:
        monkeypatch.setattr(m, "translate", slow_when_long(m.translate))
    long = " ".join(SENTENCE.split() * 20)  # cut to LIMITS.max_chars = 300 characters: the long lane
    with real_server(loaded) as (url, port, server), ThreadPoolExecutor(2) as pool:
        longs = [pool.submit(httpx.post, url + "translate", json={"text": long}, timeout=60) for _ in range(2)]
        assert started.wait(60)
        asked = time.monotonic()
        r = httpx.post(url + "translate", json={"text": SENTENCE}, timeout=60)
        took = time.monotonic() - asked
        assert r.status_code == 200 and took < 2, (r.status_code, took)  # in one lane: after 3 s of the long one
        assert [f.result().status_code for f in longs] == [200, 200]


def test_a_models_two_lanes_never_mix_their_translations(loaded):
    """A model translates a short and a long request at once (one per lane): each gets what it gets alone."""
    model = loaded[0][2]  # with self-attention
    long = " ".join(SENTENCE.split() * 6)
    alone = {SENTENCE: model.translate(SENTENCE, 5, 100), long: model.translate(long, 1, 100)}
    with ThreadPoolExecutor(2) as pool:
        for _ in range(5):  # a beam search in the short lane beside a greedy one in the long lane
            both = [pool.submit(model.translate, SENTENCE, 5, 100, True), pool.submit(model.translate, long, 1, 100)]
            short_reply, long_reply = (f.result() for f in both)
            for reply, text in ((short_reply, SENTENCE), (long_reply, long)):
                for key in ("hypothesis", "src_pieces", "tgt_pieces", "weights", "self_attention"):
                    assert reply[key] == alone[text][key], key


def test_reply_weights_are_rounded_by_torch_as_round_rounds_them(loaded, monkeypatch):
    """A self-attention reply at 100 pieces is 2 x 8 x 100 x 100 weights: a round() for each held the interpreter
    lock (and so the event loop) for most of a second on a busy machine; torch rounds them all at once, to the
    same floats."""
    import builtins

    from nmt.serve.models import rounded

    weights = torch.softmax(torch.randn(2, 8, 100, 100) * 3, -1)  # float32, as the models give them
    expected = [[[[round(w, 4) for w in row] for row in head] for head in layer] for layer in weights.tolist()]
    assert rounded(weights) == expected
    ties = torch.tensor([(2 * k + 1) / 32 for k in range(16)])  # x 10**4 exactly at a half: to even, as round()
    assert rounded(ties) == [round(w, 4) for w in ties.tolist()] and rounded(ties)[:2] == [0.0312, 0.0938]
    calls = []
    original = builtins.round
    monkeypatch.setattr(builtins, "round", lambda *a: (calls.append(a), original(*a))[1])
    reply = loaded[0][2].translate(" ".join(SENTENCE.split() * 6), 1, 100)
    monkeypatch.undo()
    assert len(reply["weights"]) > 1 and reply["self_attention"]["weights"]
    assert len(calls) < 10, f"{len(calls)} calls of round() for one reply"  # the time, not one per weight
