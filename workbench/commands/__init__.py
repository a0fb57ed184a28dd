"""CLI commands: each module holds one Typer-compatible function, registered in workbench.cli.

Command modules import the library inside their functions, the one place in the package where
imports are deferred on purpose: `workbench --help` imports every command module, and with the
library at their tops it took 8.9 s on this machine (2 cores, loaded), against 0.5 s now.
tests/test_imports.py checks that importing workbench.cli loads neither torch nor pandas.
"""
