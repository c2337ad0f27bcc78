"""nmt-train's multirun launcher as a Hydra plugin (Hydra instantiates launchers from this package only): the
launcher itself is nmt.cli.launcher.ClaimingLauncher."""

from nmt.cli.launcher import ClaimingLauncher


class NMTLauncher(ClaimingLauncher):
    """hydra/launcher=nmt_basic (configs/launcher/sequential.yaml)."""
