"""CLI commands: each module holds one Typer-compatible function, registered in workbench.cli."""
