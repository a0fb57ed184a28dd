"""The `workbench` command: a thin Typer app over the library.

Every command parses its arguments, calls library functions and prints a summary. Exit status:
0 done; 1 a check that failed (identity not 0.0), or the machine refused (a full disk: one line);
2 bad input or a refused operation (a `WorkbenchError`: one line on stderr; `--debug` shows the
traceback instead); 3 a run stopped by the capability guardrail; 130 Ctrl-C (SIGINT) and 143
SIGTERM. Both signals unwind the command like an exception, so every writer's clean-up runs:
staging directories are removed and what was complete before stays as it was.
"""

from __future__ import annotations

import signal
import sys
import threading

import typer

from workbench.commands.claims import claims
from workbench.commands.compare import compare
from workbench.commands.demo import demo
from workbench.commands.figures import figures
from workbench.commands.generate import generate
from workbench.commands.identity import identity
from workbench.commands.launch import launch
from workbench.commands.lens import lens
from workbench.commands.probe import probe
from workbench.commands.report import report
from workbench.commands.rows import rows
from workbench.commands.select_block import select_block
from workbench.commands.train import train
from workbench.errors import WorkbenchError

app = typer.Typer(
    help="Looped retrofits of pretrained LMs: build, train, and look inside every loop.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
_state = {"debug": False}


@app.callback()
def main(debug: bool = typer.Option(False, "--debug", help="Show tracebacks instead of one-line errors.")):
    """Looped retrofits of pretrained LMs: build, train, and look inside every loop."""
    _state["debug"] = debug


app.command("identity")(identity)
app.command("demo")(demo)
app.command("rows")(rows)
app.command("select-block")(select_block)
app.command("train")(train)
app.command("launch")(launch)
app.command("probe")(probe)
app.command("lens")(lens)
app.command("generate")(generate)
app.command("compare")(compare)
app.command("report")(report)
app.command("figures")(figures)
app.command("claims")(claims)


def _terminated(signum, frame):
    raise SystemExit(128 + signum)  # unwinds like Ctrl-C: `finally` and `except BaseException` clean-ups run


def _catch_signals() -> None:
    """SIGINT raises KeyboardInterrupt and SIGTERM SystemExit(143), even where the parent ignored SIGINT.

    A shell starts a background job with SIGINT ignored, and Python then leaves it ignored: a
    `kill -INT` would let the command run to the end and exit 0.
    """
    if threading.current_thread() is threading.main_thread():  # signal.signal works only there
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, _terminated)


def run() -> None:
    """Entry point: runs the app, turning WorkbenchError into one line and exit status 2."""
    _catch_signals()
    stdout = sys.stdout   # a --json command sends stdout to stderr until its result (`Output`): put back here
    try:
        code = app(standalone_mode=False)  # a command's typer.Exit(code) comes back here, not as an exception
    except WorkbenchError as err:
        if _state["debug"]:
            raise
        typer.echo(f"error: {err}", err=True)
        sys.exit(2)
    except OSError as err:  # the machine's, not the input's: a full disk, a permission, a vanished file
        if _state["debug"]:
            raise
        where = f": '{err.filename}'" if err.filename else ""
        typer.echo(f"error: {err.strerror or err}{where} (workbench --debug shows where)", err=True)
        sys.exit(1)
    except Exception as err:  # usage errors arrive here in non-standalone mode
        # typer vendors its own click; recognise its exceptions by their interface
        if type(err).__name__ == "NoArgsIsHelpError":
            typer.echo(err.ctx.get_help() if getattr(err, "ctx", None) else "see: workbench --help")
            sys.exit(0)
        if hasattr(err, "format_message") and getattr(err, "exit_code", None) == 2:  # a usage error: one line too
            ctx = getattr(err, "ctx", None)
            where = f"{ctx.command_path} --help" if ctx is not None else "workbench --help"
            typer.echo(f"error: {err.format_message()} (see: {where})", err=True)
            sys.exit(2)
        if hasattr(err, "show") and hasattr(err, "exit_code"):
            err.show()
            sys.exit(err.exit_code)
        if type(err).__name__ == "Abort":
            sys.exit(130)
        raise
    finally:
        sys.stdout = stdout
    if isinstance(code, int) and code != 0:
        sys.exit(code)
