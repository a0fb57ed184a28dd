"""Static images (PDF, SVG, PNG) through kaleido and the system Chromium.

kaleido is the `dev` extra, not a dependency: plots, the HTML report and HTML exports work
without it, so it is imported only where an image is made. Nothing here downloads a browser.
"""

from __future__ import annotations

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
        # traceback on stderr) and every later export would wait on it forever. The thread's error is kept
        # instead, and a first image must come back within START_S.
        threading.excepthook = lambda args: failed.append(args.exc_value)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                kaleido.Kaleido()   # finds the browser and opens nothing: a missing one is refused here, at once
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
