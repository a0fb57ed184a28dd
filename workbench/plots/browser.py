"""Static images (PDF, SVG, PNG) through kaleido and the system Chromium.

kaleido is the `dev` extra, not a dependency: plots, the HTML report and HTML exports work
without it, so it is imported only where an image is made. Nothing here downloads a browser.
A browser that is missing, fails or never answers ends in one line (`NO_BROWSER`) within `START_S`:
the first image is drawn in a child process that is killed then, never on a thread that would wait.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import warnings

from workbench.errors import WorkbenchError

START_S = 60   # a browser that has not drawn a first image by then is not going to
NO_BROWSER = ("install it with `make browser` in a checkout (Debian's package, needs root) or put a chromium on PATH; "
              "--format html needs no browser")


def browser_errors() -> tuple[type[Exception], ...]:
    """Returns what kaleido raises when it cannot start or drive a browser: its own errors (choreographer's
    browser errors among them) and OSError (no executable, a sandbox, a timeout).

    Raises:
        ImportError: kaleido is not installed.
    """
    from kaleido import errors  # noqa: PLC0415 -- optional (the dev extra)

    return (OSError, errors.ChromeNotFoundError, errors.BrowserFailedError, errors.BrowserClosedError,
            errors.JavascriptError, errors.KaleidoError)


class Browser:
    """One kaleido/Chromium server for every static export in the `with` block.

    Raises (on entering):
        WorkbenchError: kaleido is not installed, or it cannot start Chromium; one line saying how to get them.
    """

    def __enter__(self) -> Browser:
        try:
            import kaleido  # noqa: PLC0415 -- optional (the dev extra)
        except ImportError:
            raise WorkbenchError("static export (pdf, svg, png) needs kaleido, which is not installed "
                                 "(pip install -e '.[dev]'); --format html needs no browser") from None
        failed: list[BaseException] = []
        hook = threading.excepthook
        # kaleido starts the browser on a thread of its own: a browser that fails there ends that thread (its
        # traceback on stderr) and every later export would wait on it forever. A first image is drawn in a
        # child process first (one that hangs is killed), then through the server, whose thread's error is kept.
        threading.excepthook = lambda args: failed.append(args.exc_value)
        try:
            _first_image_elsewhere()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                kaleido.start_sync_server(silence_warnings=True)
                _first_image(kaleido, failed)
        except browser_errors() as err:
            if failed:   # the server's thread has ended: stopping it returns at once (a stuck one would not)
                kaleido.stop_sync_server(silence_warnings=True)
            first = str(err).splitlines()[0][:160] if str(err) else type(err).__name__
            raise WorkbenchError(f"static export (pdf, svg, png) needs Chromium, which kaleido could not start ({first}); "
                                 f"{NO_BROWSER}") from None
        finally:
            threading.excepthook = hook
        return self

    def __exit__(self, *exc) -> None:
        import kaleido  # noqa: PLC0415 -- optional (the dev extra); imported by __enter__

        kaleido.stop_sync_server(silence_warnings=True)


def _first_image_elsewhere() -> None:
    """Draws an empty figure in a process of its own, killed after START_S: a browser that starts but never answers
    holds kaleido's threads, and with them this process's exit, so it is tried where it can be left behind.

    Raises:
        OSError: the image did not come back (the child's last line says why), or not within START_S.
    """
    draw = "import kaleido; kaleido.calc_fig_sync({'data': [], 'layout': {}})"
    # its own session: on a timeout (or Ctrl-C) the child and the browser it started are killed together
    with subprocess.Popen([sys.executable, "-c", draw], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as child:
        try:
            _, err = child.communicate(timeout=START_S)
        except BaseException as stopped:
            os.killpg(child.pid, signal.SIGKILL)
            child.communicate()
            if isinstance(stopped, subprocess.TimeoutExpired):
                raise TimeoutError(f"no image within {START_S} s") from None
            raise
    if child.returncode != 0:
        last = (err.strip().splitlines() or [f"exit status {child.returncode}"])[-1]
        name, _, said = last.partition(": ")   # "choreographer....ChromeNotFoundError: No browser found ..."
        raise OSError(said if said and name.endswith("Error") else last)


def _first_image(kaleido, failed: list[BaseException]) -> None:
    """Draws an empty figure through the started server, waiting at most START_S; raises what kept it from drawing.

    Raises:
        TimeoutError: no image within START_S (an OSError: one of `browser_errors`).
        Exception: the server thread's own error, as kaleido raised it.
    """
    drawn: list = []
    call = threading.Thread(target=lambda: drawn.append(kaleido.calc_fig_sync({"data": [], "layout": {}})),
                            daemon=True)   # left waiting on a dead server, it ends with the process
    call.start()
    deadline = time.monotonic() + START_S
    while call.is_alive() and not failed and time.monotonic() < deadline:
        call.join(0.1)
    if failed:
        raise failed[0]
    if not drawn:
        raise TimeoutError(f"no image within {START_S} s")
