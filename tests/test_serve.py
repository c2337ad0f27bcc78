"""nmt-serve: the JSON API (every kind of bad input, limits, concurrency), start-up errors, and the page in a
real browser (headless Chromium from Debian's `chromium` package, driven by Playwright).

    python -m pytest -q tests/test_serve.py

Two tiny checkpoints of the quick preset are trained once (attention=luong and attention=none, sharing one
data cache). The API runs in-process through Starlette's TestClient; concurrency, the start-up errors and
the browser use real `nmt-serve` processes on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import torch

with warnings.catch_warnings():  # Starlette 1.10 prefers httpx2, which needs Python 3.11; httpx still works
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from nmt.serve.app import create_app
from nmt.serve.examples import Examples, find_examples
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


def train(root: Path, attention: str) -> Path:
    """A few steps of the quick preset: enough for a checkpoint that translates (badly) and attends."""
    run = root / attention
    cmd = [
        str(BIN / "nmt-train"),
        "experiment=quick",
        f"attention={attention}",
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
    return [train(root, "luong"), train(root, "none")]


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
    """A real `nmt-serve` process on a free port of 127.0.0.1; yields its base URL."""
    proc = subprocess.Popen(
        [str(BIN / "nmt-serve"), *map(str, ckpts), "--port", "0", "--threads", "1"],
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
    luong, none = reply["results"]
    assert luong["label"] == "luong (general, current query, input feeding)" and luong["has_alignment"]
    assert none["label"] == "none (fixed sentence vector, into every step, input feeding)" and not none["has_alignment"]
    for res in (luong, none):
        assert res["src_pieces"][-1] == "</s>" and len(res["src_pieces"]) >= 6
        assert len(res["weights"]) == len(res["tgt_pieces"]) >= 1
        assert all(len(row) == len(res["src_pieces"]) for row in res["weights"])
        assert isinstance(res["hypothesis"], str) and res["time"] > 0 and res["note"] is None
    assert all(abs(sum(row) - 1) < 1e-3 for row in luong["weights"])  # a distribution over the source
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
    assert [m["label"] for m in info["models"]] == [
        "luong (general, current query, input feeding)",
        "none (fixed sentence vector, into every step, input feeding)",
    ]
    assert info["models"][0]["settings"]["attention_options"] == {"score": "general"}
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


def test_over_long_text_is_cut_with_a_note(client):
    words = SENTENCE.split() * 20  # 100 words, about 500 characters
    reply = post(client, json.dumps({"text": " ".join(words)})).json()
    assert reply["truncated"] and len(reply["text"]) == LIMITS.max_chars
    assert any("over the limit of 300; translated its first 300" in n for n in reply["notes"])
    for res in reply["results"]:  # then cut to max_pieces source pieces, EOS kept
        assert len(res["src_pieces"]) == LIMITS.max_pieces and res["src_pieces"][-1] == "</s>"
        assert "over the limit of 30" in res["note"]
        assert len(res["tgt_pieces"]) <= 1.5 * LIMITS.max_pieces + 10 + 1
    page = client.post("/", data={"text": " ".join(words), "beam": "1"}).text
    assert "translated its first 300" in page and 'class="notes"' in page


def test_odd_text_never_breaks_a_reply(client):
    for text in ["\ud800 raka", "raka\x00laba", "\x00", "\u200b", "<b>raka</b> & \u202e\u05d0", "🙂 " * 20]:
        r = post(client, json.dumps({"text": text}))
        assert r.status_code == 200, r.text
        assert len(r.json()["results"]) == 2


def test_a_failing_model_is_a_500_and_the_server_goes_on(client, loaded, monkeypatch):
    def broken(*args):
        raise RuntimeError("boom")

    monkeypatch.setattr(loaded[0][1], "translate", broken)
    r = post(client, json.dumps({"text": SENTENCE}))
    assert r.status_code == 500 and "internal error (RuntimeError: boom)" in r.json()["error"]
    monkeypatch.undo()
    assert post(client, json.dumps({"text": SENTENCE})).status_code == 200


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
    luong = reply["results"][0]
    cells = re.findall(r'class="cell" data-t="(\d+)" data-s="(\d+)" data-w="([^"]+)"', html)
    assert len(cells) == len(luong["tgt_pieces"]) * len(luong["src_pieces"])
    assert all(float(w) == luong["weights"][int(t)][int(s)] for t, s, w in cells)
    assert html.count("<svg") == 1 and "there is no alignment to show" in html


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
    assert httpx.get(server + "api/models").status_code == 200
    assert httpx.get(server + "api/models", headers={"Host": "evil.example"}).status_code == 400


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


@pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="needs Debian's chromium at /usr/bin/chromium (apt-get install -y chromium; .ci/run installs it)",
)
def test_the_page_in_a_real_browser(server, tmp_path):
    from playwright.sync_api import sync_playwright

    api = httpx.post(server + "translate", json={"text": SENTENCE, "beam": 1}, timeout=60).json()["results"][0]
    outside, errors = [], []
    with sync_playwright() as pw, tempfile.TemporaryDirectory() as profile:
        browser = pw.chromium.launch_persistent_context(
            profile,
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1300, "height": 900},
        )
        try:
            page = browser.new_page()
            page.on("request", lambda req: req.url.startswith(server) or outside.append(req.url))
            page.on("console", lambda msg: msg.type == "error" and errors.append(msg.text))
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(server)
            page.fill("#text", SENTENCE)
            page.click("#translate")
            page.wait_for_selector("svg.heatmap rect.cell")
            cards = page.locator("section.model")
            assert cards.count() == 2
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
        finally:
            browser.close()
    assert outside == [] and errors == []
