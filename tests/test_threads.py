"""trainer.threads (nmt.threads) and the progress bar's estimate (nmt.progress): auto leaves the cores other
processes keep busy, never goes above torch's count, says why; the load is measured from the machine as it is;
the bar's end and estimate follow the recent step rate and the time budget.

(That a resume keeps the checkpoint's count, or refuses another: test_resume.py.)
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import pytest
import torch

from nmt.errors import ConfigError
from nmt.progress import TrainingBar
from nmt.threads import NOISE, Load, LoadMeter, Threads, choose, parse


@pytest.fixture
def two_threads():
    """torch at two threads for one test (auto never chooses more than torch would use), then as before."""
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(old)


def test_the_setting_is_checked_in_one_line():
    assert [parse(v) for v in ("auto", "adaptive", None, 3, "2")] == ["auto", "adaptive", None, 3, 2]
    for bad in ("0", "-1", "fast", 0):
        with pytest.raises(ConfigError, match=r"trainer\.threads=.*use auto .*adaptive .*a number of threads"):
            parse(bad)


@pytest.mark.parametrize("cores", [1, 2, 4, 16])
@pytest.mark.parametrize("ceiling", [1, 2, 8])
def test_auto_leaves_busy_cores_alone_and_stays_under_torchs_count(cores, ceiling):
    for tenths in range(0, 10 * cores + 1):
        others = tenths / 10
        count, why = choose(ceiling, Load(cores, others, 0.3))
        assert 1 <= count <= ceiling
        assert count <= max(1, cores - others + NOISE)  # never a thread on a core others keep busy
        assert f"{others:.2f} of {cores} cores" in why
    assert choose(ceiling, Load(cores, 0.0, 0.3))[0] == min(ceiling, cores)  # a quiet machine: torch's count
    assert choose(ceiling, Load(cores, 0.05, 0.3))[0] == min(ceiling, cores)  # a shell's noise changes nothing
    assert choose(2, Load(2, 1.0, 0.3))[0] == 1  # one busy process on two cores: scripts/busy_machine.py's case
    assert choose(ceiling, None) == (ceiling, f"the load cannot be measured here (no /proc/stat): torch's {ceiling}")


def spinner() -> subprocess.Popen:
    """Another process that keeps one core busy."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the load is read from /proc/stat")
def test_the_load_of_another_process_is_seen_and_auto_steps_aside(two_threads, caplog):
    proc = spinner()
    try:
        time.sleep(0.2)  # started
        meter = LoadMeter()
        time.sleep(0.5)
        load = meter.read()
        with caplog.at_level(logging.INFO, logger="nmt.threads"):
            threads = Threads("auto")
    finally:
        proc.kill()
        proc.wait()
    assert load.cores >= 1 and load.others >= 0.6, load  # the spinner (and whatever else runs here)
    assert threads.count == torch.get_num_threads() <= max(1, load.cores - 1)
    assert "threads: " in caplog.text and "trainer.threads=auto: other processes keep " in caplog.text


def test_this_process_own_work_is_not_counted_as_load():
    meter = LoadMeter()
    before, end = os.times(), time.monotonic() + 5
    while time.monotonic() < end and sum(os.times()[:2]) - sum(before[:2]) < 0.3:  # this process keeps a core
        pass  # busy until it has run 0.3 s (on a loaded machine that takes longer)
    load = meter.read()
    after = os.times()
    own = (after.user + after.system - before.user - before.system) / load.seconds  # cores' worth this process ran
    assert load.others <= load.cores - own + 0.2, (load, own)  # the cores' time, less ours: what others can hold


def test_a_fixed_count_is_honoured_whatever_the_load(two_threads):
    proc = spinner()
    try:
        assert Threads(2).count == torch.get_num_threads() == 2
        assert Threads("1").count == torch.get_num_threads() == 1
        assert Threads(None).why == "torch's default"
    finally:
        proc.kill()
        proc.wait()


def test_auto_and_adaptive_keep_a_checkpoints_count_and_carry_its_changes(two_threads):
    threads = Threads("adaptive", window=0.05)
    threads.resume({"threads": {"setting": "adaptive", "count": 1, "changes": [{"step": 5, "from": 2, "to": 1}]}})
    assert threads.count == torch.get_num_threads() == 1
    assert threads.record()["changes"] == [{"step": 5, "from": 2, "to": 1}]
    older = Threads("auto", window=0.05)  # a checkpoint written before the record: its provenance's count
    older.resume({"provenance": {"threads": 2}})
    assert older.count == torch.get_num_threads() == 2
    fixed = Threads(1)  # as asked: the resume check compares it with the checkpoint's (test_resume.py)
    fixed.resume({"threads": {"count": 2}})
    assert fixed.count == torch.get_num_threads() == 1


def test_a_checkpoints_count_is_kept_above_what_auto_would_choose_with_a_warning(caplog):
    old = torch.get_num_threads()
    torch.set_num_threads(1)  # auto chooses at most one now
    try:
        threads = Threads("auto")
        with caplog.at_level(logging.WARNING, logger="nmt.threads"):
            threads.resume({"threads": {"setting": "auto", "count": 2, "changes": []}})
        assert threads.count == torch.get_num_threads() == 2
        assert "threads: 2, the checkpoint's, kept (trainer.threads=auto would choose 1 now" in caplog.text
        assert "trainer.threads=1 trainer.resume_changes=allow trades exactness for speed" in caplog.text
    finally:
        torch.set_num_threads(old)


def test_the_bar_ends_where_the_time_budget_stops_the_run():
    bar = TrainingBar(total_steps=100_000, step=0, max_minutes=0.05, spent=0.0, enabled=False)  # a 3 s budget
    start = time.perf_counter()
    for _ in range(20):
        time.sleep(0.01)
        bar.advance(time.perf_counter() - start)
    rate = bar.recent_rate()
    left = 3.0 - (time.perf_counter() - start)
    assert 20 < bar.total < 100_000  # not the step budget of hours
    assert abs((bar.total - 20) / rate - left) < 0.5  # the estimate: about the budget left at the recent rate
    assert bar.format_dict["rate"] == pytest.approx(rate)


def test_the_estimate_follows_the_recent_rate_not_the_average():
    bar = TrainingBar(total_steps=1000, step=0, max_minutes=None, spent=0.0, enabled=False)
    for _ in range(60):  # fast steps first ...
        bar.advance(0.0)
    for _ in range(60):  # ... then the machine gets busy
        time.sleep(0.005)
        bar.advance(0.0)
    assert bar.total == 1000  # no time budget: the step budget
    assert bar.recent_rate() < 250  # the slow steps' rate (at most 200/s), not the whole run's average
