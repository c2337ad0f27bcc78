"""Multi30k (task 1, raw): read from a folder, or download the pinned files and check their sha256."""

from __future__ import annotations

import hashlib
import urllib.error
import urllib.request
from pathlib import Path

from nmt.atomic import atomic_path
from nmt.corpora.corpus import Corpus, Pair
from nmt.corpora.text import read_parallel
from nmt.corpora.windows import add_window_splits, check_window
from nmt.errors import DataError

MULTI30K_URL = (
    "https://raw.githubusercontent.com/multi30k/dataset/a3d2e0d26b56f3846f66a952536ffed4e401d05a/data/task1/raw/{file}"
)
MULTI30K_SHA256 = {
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
    "test_2017_flickr.de.gz": "a2c89666db00c495cd8513b9d708d5a3acc205d7de312ef2bf5fb7ebc1540aee",
    "test_2017_flickr.en.gz": "76a444ee25172e72695cddb13ae4a3bda59430617be88e0bb46b60504f054074",
    "test_2017_flickr.fr.gz": "3ba671ceb2299f3304ffafefea7a833d08632fbaf0ba18546f8a2ec2391af496",
    "test_2017_mscoco.de.gz": "799e4854c25d601cb6cb6be29eabe5667734c61ace2f495e03e429031a0bc338",
    "test_2017_mscoco.en.gz": "aab300bfb4427697987e02cd0aacd44bfe8aa50456231b6474c08038bbed2b58",
    "test_2017_mscoco.fr.gz": "754f3072ba9f124569ba5258b32730fc1d214bbf8e0c6dfb2b74401676220db0",
    "test_2018_flickr.de.gz": "ddd0130c7d97482dc5197a02141dae8dd79f20f03586c480d675c09a32daf608",
    "test_2018_flickr.en.gz": "ef4f4844037d4c5dea75c9a8ed5fd78905967a26f67c255e230cc9780032654d",
    "test_2018_flickr.fr.gz": "fb2b83fcceb937a4f7e3e93c1c51c22aba92f1e342391e6b5ba392b16a920501",
}
_MULTI30K_SPLITS = {  # Corpus split -> file stem
    "train": "train",
    "valid": "val",
    "test": "test_2016_flickr",
    "test_2017_flickr": "test_2017_flickr",
    "test_2017_mscoco": "test_2017_mscoco",
    "test_2018_flickr": "test_2018_flickr",
}
_MANUAL = "download the Multi30k task1 raw files by hand and pass data.root=FOLDER"


def _verify_sha256(path: Path, expected: str, origin: str) -> None:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != expected:
        raise DataError(f"{origin}: sha256 is {digest}, expected {expected}; the file is corrupt or changed, {_MANUAL}")


def _download(file: str, folder: Path) -> None:
    url = MULTI30K_URL.format(file=file)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise DataError(f"{folder}: cannot write there ({err}); pass a writable download folder") from None
    try:  # renamed when complete and checked, so an interrupted download never looks finished
        with atomic_path(folder / file) as tmp:
            with open(tmp, "wb") as out, urllib.request.urlopen(url, timeout=60) as response:
                out.write(response.read())
            _verify_sha256(tmp, MULTI30K_SHA256[file], url)
    except (urllib.error.URLError, OSError) as err:
        raise DataError(f"{url}: download failed ({err}); {_MANUAL}") from None


def _multi30k_folder(root: str | None, files: list[str], download_dir: str) -> Path:
    """data.root where given (it must hold `files`: nothing is downloaded then), else the download folder."""
    if root is not None:
        folder = Path(root)
        if not folder.is_dir():
            raise DataError(
                f"data.root={root}: no such folder; pass the folder that holds the Multi30k task1 raw files "
                f"({files[0]}, ...), or leave data.root out to download them into {download_dir}"
            )
        missing = [f for f in files if not (folder / f).is_file()]
        if missing:
            raise DataError(
                f"data.root={root}: lacks {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''} "
                f"({len(missing)} of the {len(files)} files this language pair needs); pass the folder that holds "
                "the Multi30k task1 raw files, or leave data.root out to download them"
            )
        return folder
    folder = Path(download_dir)
    for file in files:
        path = folder / file
        if path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == MULTI30K_SHA256[file]:
            continue  # downloaded before
        _download(file, folder)
    return folder


def load_multi30k(
    root: str | None = None,
    src_lang: str = "de",
    tgt_lang: str = "en",
    window: int = 1,
    window_test: int | None = None,
    download_dir: str = "data/multi30k",
) -> Corpus:
    """Multi30k task 1 between English and German or French, in either direction.

    With `window` K > 1 (the bottleneck study's caption windows), training joins 1..K captions of a fresh
    shuffle each epoch, and valid and every test set get `<split>_k1..<split>_k<window_test or K>`: the captions
    in file order joined k at a time (nmt.corpora.windows).
    """
    largest = check_window(window, window_test, "captions")
    if {src_lang, tgt_lang} not in ({"de", "en"}, {"fr", "en"}):
        raise DataError(f"Multi30k pairs English with German or French; got {src_lang}->{tgt_lang}")
    files = [f"{stem}.{lang}.gz" for stem in _MULTI30K_SPLITS.values() for lang in (src_lang, tgt_lang)]
    folder = _multi30k_folder(root, files, download_dir)
    splits: dict[str, list[Pair]] = {}
    n_empty = 0
    for name, stem in _MULTI30K_SPLITS.items():
        splits[name], n = read_parallel(folder / f"{stem}.{src_lang}.gz", folder / f"{stem}.{tgt_lang}.gz")
        n_empty += n
    dropped = {"empty": n_empty} if n_empty else {}
    splits = add_window_splits(splits, {}, largest)
    return Corpus(f"multi30k-{src_lang}-{tgt_lang}", src_lang, tgt_lang, splits, dropped, window=window)
