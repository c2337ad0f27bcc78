"""nmt-train's multirun launcher: Hydra's basic launcher (the jobs one after another, in this process), each job's
run directory claimed (nmt.rundir.claim) before Hydra writes anything into it.

Hydra makes a job's directory, opens its log and writes .hydra/ before the job's code runs, and no callback of
Hydra's comes between (on_job_start comes after): claiming the directory only in nmt-train's code would let a second
sweep overwrite a running job's .hydra/ before it is refused. Here each job is claimed first; a job another process
holds (the same sweep started twice) stops the sweep in one line, exit status 2, that directory untouched. A job's
directory is released when the job ends. (configs/launcher/sequential.yaml, the default, selects it, as
hydra/launcher=nmt_basic: nmt.cli.schema.register_launcher; launcher=local_parallel and launcher=slurm replace it,
and their jobs claim their directories in nmt-train.)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from hydra._internal.core_plugins.basic_launcher import BasicLauncher
from hydra.core.utils import JobReturn, configure_log, filter_overrides, run_job, setup_globals
from omegaconf import open_dict

log = logging.getLogger(__name__)


class ClaimingLauncher(BasicLauncher):
    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        """BasicLauncher.launch, with each job's directory claimed before run_job writes into it."""
        from nmt.cli.callbacks import claim_or_exit
        from nmt.rundir import release

        setup_globals()
        assert self.hydra_context is not None and self.config is not None and self.task_function is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        log.info(f"Launching {len(job_overrides)} jobs locally")
        runs: list[JobReturn] = []
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            sweep_config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(sweep_config):
                sweep_config.hydra.job.id = idx
                sweep_config.hydra.job.num = idx
            job_dir = Path(str(sweep_config.hydra.sweep.dir)) / str(sweep_config.hydra.sweep.subdir)
            claim_or_exit(job_dir)
            try:
                log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
                ret = run_job(
                    hydra_context=self.hydra_context,
                    task_function=self.task_function,
                    config=sweep_config,
                    job_dir_key="hydra.sweep.dir",
                    job_subdir_key="hydra.sweep.subdir",
                )
            finally:
                release(job_dir)
            runs.append(ret)
            configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        return runs
