"""Hydra callbacks (configs/hydra/default.yaml): nmt-train claims its run directory before Hydra writes into it.

Hydra makes the run directory, opens train.log in it and writes .hydra/ before nmt-train's code runs. Without this
callback a second trainer started in a run directory in use would overwrite the first one's .hydra/config.yaml
before anything refused it, and a read-only run directory would fail in Hydra's logging setup with a traceback.
ClaimRunDirectory runs before all that (on_run_start) and claims the directory (nmt.rundir.claim: the lock, then
a check that the run can write there); a failure is one line and exit status 2, as for the commands' other errors.
A multirun's sweep directory is checked the same way; each of its jobs claims its own directory in nmt-train.
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
            _or_exit(lambda: claim(Path(OmegaConf.select(config, "hydra.run.dir")), report=False))

    def on_multirun_start(self, config: DictConfig, config_name: str | None = None) -> None:
        if _writes_a_run_directory(config):
            _or_exit(lambda: writable(Path(OmegaConf.select(config, "hydra.sweep.dir"))))


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
