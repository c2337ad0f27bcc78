"""python scripts/serve_screenshot.py URL --out docs/serve.png [--example N | --text TEXT] [--beam 1|5] [--hover M,T]
       [--self-attention M,L,H [--hover-self Q]]

A screenshot of a running nmt-serve page, as in the README: headless Chromium (Debian's /usr/bin/chromium,
driven by Playwright) opens URL, clicks example button N (1-based) or types TEXT, translates, hovers the
heaviest cell of output row T in the M-th checkpoint's heatmap (1-based; the tooltip shows in the picture)
and saves the whole page (it translates twice: the times on the page are those of a warm server):

    nmt-serve none/checkpoints/best.pt bahdanau/checkpoints/best.pt luong/checkpoints/best.pt &
    python scripts/serve_screenshot.py http://127.0.0.1:8000/ --example 3 --hover 2,5 --out docs/serve.png

--self-attention M,L,H (all 1-based) picks layer L and head H in the self-attention selectors of the M-th
checkpoint's card (a checkpoint trained with model.self_attention_layers > 0) before the screenshot, and
hovers the heaviest cell of query row Q of that map instead (--hover-self, default 1), so the tooltip shows
there:

    nmt-serve luong/checkpoints/best.pt selfattn/checkpoints/best.pt &
    python scripts/serve_screenshot.py http://127.0.0.1:8000/ --example 1 --self-attention 2,2,1 --out sa.png
"""

from __future__ import annotations

import argparse
import tempfile

from playwright.sync_api import sync_playwright

FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def main() -> None:
    p = argparse.ArgumentParser(description="Screenshot a running nmt-serve page (see the module docstring).")
    p.add_argument("url")
    p.add_argument("--out", required=True)
    p.add_argument("--example", type=int, default=None, help="click the N-th example sentence (1-based)")
    p.add_argument("--text", help="type this sentence instead")
    p.add_argument("--beam", choices=("1", "5"), default="1")
    p.add_argument("--hover", default="2,5", help="M,T: hover row T's heaviest cell in the M-th heatmap card")
    p.add_argument("--self-attention", help="M,L,H: show layer L, head H of the M-th card's self-attention (1-based)")
    p.add_argument("--hover-self", type=int, default=1, help="with --self-attention: hover query row Q's heaviest cell")
    p.add_argument("--width", type=int, default=1500)
    p.add_argument("--chromium", default="/usr/bin/chromium")
    args = p.parse_args()
    card, row = (int(x) - 1 for x in args.hover.split(","))
    with sync_playwright() as pw, tempfile.TemporaryDirectory() as profile:
        browser = pw.chromium.launch_persistent_context(
            profile,
            executable_path=args.chromium,
            headless=True,
            args=FLAGS,
            viewport={"width": args.width, "height": 900},
        )
        page = browser.new_page()
        page.goto(args.url)
        page.check(f'input[name=beam][value="{args.beam}"]')
        with page.expect_navigation():  # the form posts and the page is drawn anew
            if args.text:
                page.fill("#text", args.text)
                page.click("#translate")
            else:
                page.locator("button.example").nth((args.example or 1) - 1).click()
        page.wait_for_selector("svg.heatmap rect.cell")
        with page.expect_navigation():  # once more: the first request of a fresh server is slower (the times show)
            page.click("#translate")
        page.wait_for_selector("svg.heatmap rect.cell")
        cells = page.locator("section.model").nth(card).locator(f'rect.cell[data-t="{row}"]')
        if args.self_attention:
            m, layer, head = (int(x) for x in args.self_attention.split(","))
            section = page.locator("section.model").nth(m - 1).locator("section.self-attention")
            section.locator("select.sa-layer").select_option(value=str(layer))
            section.locator("select.sa-head").select_option(value=str(head))
            shown = section.locator(f'figure.sa-map[data-layer="{layer}"][data-head="{head}"]')
            shown.wait_for(state="visible")
            cells = shown.locator(f'rect.cell[data-t="{args.hover_self - 1}"]')
        weights = cells.evaluate_all("cs => cs.map(c => +c.dataset.w)")
        cells.nth(max(range(len(weights)), key=weights.__getitem__)).hover()
        page.screenshot(path=args.out, full_page=True)
        browser.close()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
