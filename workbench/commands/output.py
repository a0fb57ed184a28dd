"""What a command prints, one way for every command: its text, the paths it wrote, --quiet, --json, progress.

Every command takes `quiet: bool = QUIET, as_json: bool = JSON` and prints through `Output(quiet, as_json)`:

- text for a person (`say`, and the tables a command prints when `ui.human`): stdout; nothing with --quiet
  or --json;
- the paths written (`wrote`): stdout, with --quiet one path a line and nothing else, with --json under the
  object's "wrote";
- the result (`result`): with --json one JSON object on stdout, the only thing there (what anything else
  prints while the command runs goes to stderr); otherwise nothing;
- progress (`progress`, `step`): bars and step titles on stderr, only where stderr is a terminal and not
  with --quiet (on a pipe or in a log file: nothing).

Errors are one line on stderr whatever the flags (`workbench.cli.run`). docs/cli.md says the same for users.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import typer

QUIET = typer.Option(False, "--quiet", "-q", help="Print only the paths written, one a line (or nothing), and "
                     "errors; no progress bars.")
JSON = typer.Option(False, "--json", help="Print one JSON object on stdout: what the command produced, with the "
                    "paths written under \"wrote\"; nothing else on stdout.")


@dataclass
class Output:
    """One command's printing: `quiet` and `as_json` are its --quiet and --json; `silent` prints nothing at all
    (a rank other than the main one under `workbench launch`)."""

    quiet: bool = False
    as_json: bool = False
    silent: bool = False
    written: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        # a command called as a function (tests) gets typer's OptionInfo defaults, not booleans
        self.quiet = self.quiet is True or self.silent
        self.as_json = self.as_json is True and not self.silent
        self.stdout = sys.stdout
        if self.as_json:
            # Whatever a library prints while the command runs goes to stderr: DeepSpeed's logger, made on a
            # model's first load, writes its accelerator line to the sys.stdout of that moment. stdout keeps
            # the one JSON object (`result`); `workbench.cli.run` puts sys.stdout back whatever happens.
            sys.stdout = sys.stderr

    @property
    def human(self) -> bool:
        """Whether text for a person goes to stdout (neither --quiet nor --json)."""
        return not (self.quiet or self.as_json)

    @property
    def progress(self) -> bool:
        """Whether progress bars and step titles are shown: stderr is a terminal and --quiet was not given."""
        return not self.quiet and _is_terminal(sys.stderr)

    def say(self, *lines: str) -> None:
        """Prints text for a person on stdout, unless --quiet or --json."""
        if self.human:
            for line in lines:
                typer.echo(line)

    def step(self, line: str) -> None:
        """A long command's step title: stdout for a person; with --json on stderr where progress shows."""
        if self.human:
            typer.echo(line)
        elif self.as_json and self.progress:
            typer.echo(line, err=True)

    def wrote(self, path: str | Path, line: str | None = None) -> None:
        """Records a path written: `line` for a person (default "wrote PATH"; "" prints none), the bare path
        with --quiet."""
        self.written.append(str(path))
        if self.quiet and not (self.as_json or self.silent):   # --json wins over --quiet: the paths go in it
            typer.echo(str(path))
        elif self.human and line != "":
            typer.echo(f"wrote {path}" if line is None else line)

    def result(self, record: dict) -> None:
        """With --json, prints `record` and the paths written ("wrote") as one JSON object on stdout."""
        if self.as_json:
            sys.stdout = self.stdout
            typer.echo(json.dumps({**record, "wrote": self.written}, indent=1, default=str))


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False
