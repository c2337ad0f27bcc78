"""Strict command lines for the Hydra commands: a key the schema does not have is one line, with or without `+`.

    @strict_keys("train")
    @hydra.main(config_path=CONFIG_DIR, config_name="train", version_base="1.3")
    def main(cfg): ...

Before Hydra runs, the command line's overrides are composed once as Hydra will compose them (a sweep by its
first value). What Hydra would print in several lines and exit 1 with becomes one line on stderr, exit status 2:

    error: unknown key 'atention' in atention=bahdanau; did you mean attention=bahdanau? `nmt-train --cfg job` ...

- a key the config does not have (`trainer.max_stpes=2`), named with the nearest known key or config group;
- the same key added with `+` or `++` (`+atention=bahdanau`): Hydra suggests the `+` and would then add a key
  nothing reads, so the run would train the default model and exit 0;
- `+` on a key that exists (`+seed=3`), a value of the wrong type or outside a setting's choices, and an option
  of a config group that does not exist (`attention=foo`, with the options).

Anything else (syntax errors, --help, another --config-name) is left to Hydra.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hydra._internal.utils import get_args_parser
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

from nmt.cli.common import compose_config
from nmt.cli.interrupt import running
from nmt.errors import ConfigError, NMTError, first_line

COMMANDS = {"train": "nmt-train", "evaluate": "nmt-evaluate", "prepare": "nmt-prepare"}


@dataclass
class CommandLine:
    """A command line checked by `check_command_line`: the config it composes (a sweep by its first value, without
    its + and ++ additions) and its overrides as Hydra records them."""

    cfg: DictConfig
    task: list[str]  # the overrides Hydra records in .hydra/overrides.yaml
    hydra: list[str]  # hydra.* and hydra/* overrides
    multirun: bool  # -m


def strict_keys(
    config_name: str, then: Callable[[CommandLine], list[str]] | None = None
) -> Callable[[Callable[[], None]], Callable[[], None]]:
    """Wrap a `@hydra.main` function of config `config_name`: its command line is checked first (module doc);
    `then` may add to it (arguments it returns) or refuse it (an NMTError), e.g. nmt.cli.rerun."""

    def wrap(hydra_main: Callable[[], None]) -> Callable[[], None]:
        @functools.wraps(hydra_main)
        def main() -> None:
            with running(COMMANDS.get(config_name, config_name)):  # Ctrl-C: one line, exit 130 (nmt.cli.interrupt)
                try:
                    line = check_command_line(config_name, sys.argv[1:])
                    if line is not None and then is not None:
                        sys.argv.extend(then(line))
                except NMTError as e:
                    print(f"error: {e}", file=sys.stderr)
                    sys.exit(2)
                hydra_main()

        return main

    return wrap


def check_command_line(config_name: str, argv: Sequence[str]) -> CommandLine | None:
    """The command line `argv` of config `config_name`, checked: a ConfigError naming a mistake in its overrides
    (module doc); None where Hydra is left to read it (--help, another --config-name, a syntax error)."""
    parser = get_args_parser()
    parser.exit_on_error = False
    try:
        args, _ = parser.parse_known_args(list(argv))
    except argparse.ArgumentError:  # a usage error: Hydra prints it
        return None
    if args.help or args.hydra_help or args.shell_completion or args.config_name or args.config_path or args.config_dir:
        return None
    try:
        overrides = OverridesParser.create().parse_overrides(args.overrides)
    except OverrideParseException:
        return None
    adds = [o for o in overrides if (o.is_add() or o.is_force_add()) and not o.is_hydra_override()]
    base = [first_of_sweep(o) for o in overrides if o not in adds]
    try:
        cfg = compose_config(base, config_name, hydra_config=True)
    except (ConfigCompositionException, MissingConfigException) as e:
        error = composition_error(e, config_name, base)
        if error is None:
            return None
        raise ConfigError(error) from None
    known = known_keys(cfg)
    for o in adds:
        key, value = o.key_or_group, value_of(o.input_line)
        if key in known and o.is_add():
            raise ConfigError(f"{o.input_line}: {key} is already a key; drop the + ({key}={value})")
        if key not in known:
            raise ConfigError(unknown_key(key, o.input_line, known, config_name, added=True))
    task = [o.input_line for o in overrides if not o.is_hydra_override()]
    return CommandLine(cfg, task, [o.input_line for o in overrides if o.is_hydra_override()], bool(args.multirun))


def first_of_sweep(override) -> str:
    """A sweep override (`attention=none,bahdanau`, `seed=range(1,4)`) as its first value; others as given."""
    if not override.is_sweep_override():
        return override.input_line
    try:
        return f"{override.get_key_element()}={next(iter(override.sweep_string_iterator()))}"
    except (StopIteration, TypeError, ValueError):  # a sweep without a list of values (an interval)
        return override.input_line


def value_of(line: str) -> str:
    return line.split("=", 1)[1] if "=" in line else ""


def known_keys(cfg: DictConfig) -> set[str]:
    """Every dotted key of `cfg` (sections included) and every config group's name."""
    keys = set(OmegaConf.to_container(cfg.hydra.runtime.choices))

    def walk(tree: dict, prefix: str) -> None:
        for key, value in tree.items():
            keys.add(prefix + str(key))
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")

    walk({k: v for k, v in OmegaConf.to_container(cfg, resolve=False).items() if k != "hydra"}, "")
    return keys


def unknown_key(key: str, line: str, known: set[str], config_name: str, added: bool) -> str:
    """The message for an unknown key (`added`: it came with + or ++), with the nearest known one."""
    plus = " (a + adds a key that nothing reads)" if added else ""
    near = nearest(key, known)
    hint = f"did you mean {near}={value_of(line)}? " if near else ""
    return f"unknown key '{key}' in {line}{plus}; {hint}{_every_key(config_name)}"


def nearest(key: str, known: set[str]) -> str | None:
    """The known key most like `key`: a name in the same section where that section exists, else a key as deep."""
    section, _, name = key.rpartition(".")
    if not section or section in known:
        names = sorted(k.rpartition(".")[2] for k in known if k.rpartition(".")[0] == section)
        near = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
        return f"{section}.{near[0]}" if near and section else (near[0] if near else None)
    near = difflib.get_close_matches(key, sorted(k for k in known if k.count(".") == key.count(".")), n=1, cutoff=0.6)
    return near[0] if near else None


def composition_error(e: Exception, config_name: str, base: list[str]) -> str | None:
    """One line for what Hydra could not compose; None for what Hydra should report itself."""
    if isinstance(e, MissingConfigException) and e.options is not None and e.missing_cfg_file:
        group, _, option = e.missing_cfg_file.rpartition("/")
        return f"{group}={option}: no such {group}; choose one of {', '.join(sorted(e.options))}"
    cause = e.__cause__
    key = getattr(cause, "full_key", None) or ""
    # the override that failed: the key itself, or one below a section that does not exist (atention.score=dot)
    named = [b for b in base if b.split("=", 1)[0] in (key, "~" + key)] or [b for b in base if b.startswith(key + ".")]
    quoted = [b for b in named if f"'{value_of(b)}'" in str(cause)]  # the one whose value the message quotes
    line = (quoted or named or [None])[-1]  # else the last: a key given twice fails with its last value
    if line is None:
        return None
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)):
        rest = [b for b in base if b != line]
        try:
            known = known_keys(compose_config(rest, config_name, hydra_config=True))
        except (ConfigCompositionException, MissingConfigException):  # more than one mistake: no suggestion
            known = set()
        return unknown_key(line.split("=", 1)[0], line, known, config_name, added=False)
    if isinstance(cause, ValidationError):
        return f"{line}: {first_line(cause)}; fix the value of {key} ({_every_key(config_name)})"
    return None


def _every_key(config_name: str) -> str:
    return f"`{COMMANDS.get(config_name, config_name)} --cfg job` prints every key"
