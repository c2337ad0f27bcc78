"""Command-line entry points: the only modules that import Hydra.

Importing this package first tunes the process's CPU memory settings (nmt/memory.py), which only take
effect before torch is loaded: every entry point is a module in this package, so that comes first."""

from nmt.memory import tune_allocator

tune_allocator()
