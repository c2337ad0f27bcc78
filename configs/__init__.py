"""nmt's Hydra configs, installed as the package `nmt.configs` (pyproject.toml maps this folder there), so
a wheel or a non-editable `pip install .` carries them; nmt.cli.common.CONFIG_DIR finds them."""
