"""A run's windows (nmt.health): every 50 steps the rate, the page faults and the other runnable processes, read
from a clock and counters the test drives (no timing); the report flags a spread over 25% and shared cores."""

from types import SimpleNamespace

from nmt.health import Windows, health, others_runnable


class Machine:
    """A clock, this process's page faults and the other runnable processes, moved by the test."""

    def __init__(self):
        self.now, self.minor, self.major, self.others = 0.0, 100, 2, 0
        self.trainer = SimpleNamespace(step=0)  # what a Windows reads of the Trainer

    def windows(self, every: int) -> Windows:
        return Windows(every, lambda: self.now, lambda: (self.minor, self.major), lambda: self.others)


def train(windows: Windows, machine: Machine, steps: int, seconds: float, tokens: int = 100, others: int = 0):
    trainer = machine.trainer
    for _ in range(steps):
        machine.now += seconds
        machine.minor += 10
        machine.others = others
        trainer.step += 1
        windows.on_step(trainer, seconds, 4, tokens, False)
    return trainer


def test_a_window_closes_every_n_steps_with_its_rate_faults_and_neighbours():
    machine = Machine()
    windows = machine.windows(every=5)
    trainer = train(windows, machine, 5, seconds=0.5)  # 5 steps of 100 tokens in 2.5 s
    machine.now += 3.0  # a validation inside the next window: its wall clock, not its rate
    windows.on_validation(trainer, 3.0)
    for _ in range(5):
        machine.now += 1.0
        machine.minor += 40
        machine.major += 1
        machine.others = 2
        trainer.step += 1
        windows.on_step(trainer, 1.0, 4, 100, skipped=trainer.step == 8)  # a skipped step: no tokens
    machine.now += 0.25
    trainer.step += 1
    windows.on_step(trainer, 0.25, 4, 100, False)
    windows.close(trainer.step)
    first, second, last = windows.records
    assert first["steps"] == [1, 5] and first["full"] and first["seconds"] == 2.5
    assert first["target_tokens_per_s"] == 200.0 and first["sentences_per_s"] == 8.0
    assert (first["minor_faults"], first["major_faults"], first["minor_faults_per_s"]) == (50, 0, 20.0)
    assert first["others_runnable_mean"] == 0 and first["others_runnable_max"] == 0
    assert second["steps"] == [6, 10] and second["seconds"] == 5.0 and second["valid_seconds"] == 3.0
    assert second["target_tokens_per_s"] == 80.0  # 4 of its 5 steps trained (400 tokens) in 5 s
    assert (second["minor_faults"], second["major_faults"]) == (200, 5)
    assert second["others_runnable_mean"] == 2 and second["others_runnable_max"] == 2
    assert last["steps"] == [11, 11] and not last["full"] and last["target_tokens_per_s"] == 400.0


def test_the_report_flags_a_spread_over_a_quarter_and_shared_cores():
    machine = Machine()
    windows = machine.windows(every=10)
    for seconds in (1.0, 1.0, 1.1, 0.9):
        train(windows, machine, 10, seconds)
    calm = health(windows.records, threads=2, cores=2)
    assert calm["flags"] == [] and calm["full_windows"] == 4
    assert calm["median_target_tokens_per_s"] == 100.0 and abs(calm["spread"] - 0.202) < 1e-3
    train(windows, machine, 10, 2.5, others=1)  # a neighbour on one of the two cores: 40 tokens/s
    train(windows, machine, 3, 10.0)  # a last, partial window: left out of the spread
    windows.close()
    report = health(windows.records, threads=2, cores=2)
    assert report["windows"] == 6 and report["full_windows"] == 5
    assert report["lowest_over_median"] == 0.4 and report["shared_windows"] == [[41, 50]]
    assert report["flags"][0].startswith("windows spread 71% (> 25%): 40 to 111 target tokens/s, median 100")
    assert report["flags"][1].startswith("shared its cores: other processes runnable beyond the 0 free core(s)")
    # one thread on two cores leaves a core free: one neighbour shares nothing
    assert health(windows.records, threads=1, cores=2)["shared_windows"] == []


def test_the_other_runnable_processes_come_from_proc(tmp_path):
    """procs_running less this process's running threads; None where /proc cannot be read."""
    (tmp_path / "stat").write_text("cpu  1 2 3\nprocs_running 5\nprocs_blocked 0\n")
    for n, state in enumerate(["R", "S", "R"]):
        task = tmp_path / "self" / "task" / str(n)
        task.mkdir(parents=True)
        (task / "stat").write_text(f"{n} (python (x)) {state} 1 2 3\n")
    assert others_runnable(tmp_path) == 3
    assert others_runnable(tmp_path / "missing") is None
    assert isinstance(others_runnable(), int)  # this machine's /proc
