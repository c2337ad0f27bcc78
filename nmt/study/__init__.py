"""The bottleneck study: runs that differ only in the attention, compared on the same test content as the
inputs grow (window size k) and by source length, with seeds, paired tests and the interaction.

    records.py  a run -> one self-describing record (JSON, gzip): what every table and plot is built from
    runs.py     finding run directories and records; what a run directory says about its training
    configs.py  what runs may differ in (the attention and the seed), and the decoder each run really is
    stats.py    resampling by test unit (caption, chapter), paired tests, Holm, the interaction's interval
    report.py   study.md, study.json and the figures
    build.py    run_study: inputs -> records -> checks -> summary -> files

`nmt-study` (nmt.cli.study) is the command.
"""

from nmt.study.build import StudySettings, check_split, run_study
from nmt.study.records import RecordSettings, make_record, read_record, write_record

__all__ = ["RecordSettings", "StudySettings", "check_split", "make_record", "read_record", "run_study", "write_record"]
