"""Hydra callbacks (configs/hydra/default.yaml): nmt-train claims its run directory before Hydra writes into it.

Hydra makes the run directory, opens train.log in it and writes .hydra/ before nmt-train's code runs. Without this
callback a second trainer started in a run directory in use would overwrite the first one's .hydra/config.yaml
before anything refused it, and a read-only run directory would fail in Hydra's logging setup with a traceback.
ClaimRunDirectory runs before all that (on_run_start) and claims the directory (nmt.rundir.claim: the lock, then
a check that the run can write there); a failure is one line and exit status 2, as for the commands' other errors.
A multirun's sweep directory is checked the same way; each of its jobs' directories is claimed by the launcher
before Hydra writes there (nmt.cli.launcher). A directory claimed here that the command then leaves unused (refused,
or interrupted, before it trained) is removed (nmt.cli.rerun.forget_unused).
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from nmt.errors import NMTError
from nmt.rundir import claim, writable


class ClaimRunDirectory(Callback):
    def on_run_start(self, config: DictConfig, config_name: str | None = None) -> None:
        if _writes_a_run_directory(config) and int(os.environ.get("RANK", "0")) == 0:  # torchrun: rank 0 writes
            claim_or_exit(Path(OmegaConf.select(config, "hydra.run.dir")))

    def on_multirun_start(self, config: DictConfig, config_name: str | None = None) -> None:
        if _writes_a_run_directory(config):
            _or_exit(lambda: writable(Path(OmegaConf.select(config, "hydra.sweep.dir"))))


def claim_or_exit(run_dir: Path) -> None:
    """Claim `run_dir` for this process (nmt.rundir.claim), or exit 2 in one line; an interrupt before the run
    trains then removes it where this process made it (nmt.cli.interrupt, nmt.cli.rerun.forget_unused)."""
    from nmt.cli.interrupt import on_interrupt
    from nmt.cli.rerun import forget_unused

    _or_exit(lambda: claim(run_dir, report=False))
    on_interrupt(lambda: forget_unused(run_dir))


def _writes_a_run_directory(config: DictConfig) -> bool:
    """nmt-prepare composes nmt-train's config but writes no run directory (hydra.output_subdir: null)."""
    return OmegaConf.select(config, "hydra.output_subdir") is not None


def _or_exit(action: Callable[[], None]) -> None:
    """Run `action`; an NMTError is one line on stderr and exit status 2 (Hydra would turn an exception raised
    in a callback into a warning and go on). NMT_DEBUG=1 or HYDRA_FULL_ERROR=1 print the traceback first."""
    try:
        action()
    except NMTError as e:
        if os.environ.get("NMT_DEBUG") or os.environ.get("HYDRA_FULL_ERROR") == "1":
            traceback.print_exc()
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
