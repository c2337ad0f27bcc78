"""The bottleneck study: runs that differ only in the attention, compared on the same test content as the
inputs grow (window size k) and by source length, with seeds, paired tests and the interaction; greedy and
beam-5 decoding side by side.

    records.py     a run -> one self-describing record (JSON, gzip): what every table and plot is built from
    runs.py        finding run directories and records; what a run directory says about its training
    configs.py     what runs may differ in (the attention and the seed), and the decoder each run really is
    checks.py      the split a study may use and the records it may combine
    resampling.py  what is drawn at each k (the window; blocks of K captions for the interaction)
    stats.py       seed intervals (t), paired tests, exact p-values and Holm, the interaction
    lengths.py     BLEU by source length
    summary.py     records -> study.json's numbers
    tables.py      study.json -> Markdown tables (the study's, and several studies side by side)
    report.py      study.md, study.json and the figures
    build.py       run_study: inputs -> records -> checks -> summary -> files

`nmt-study` (nmt.cli.study) is the command.
"""

from nmt.study.build import StudySettings, run_study
from nmt.study.checks import check_split
from nmt.study.records import RecordSettings, make_record, read_record, write_record

__all__ = ["RecordSettings", "StudySettings", "check_split", "make_record", "read_record", "run_study", "write_record"]
