"""Static images (PDF, SVG, PNG) through kaleido and the system Chromium.

kaleido is the `dev` extra, not a dependency: plots, the HTML report and HTML exports work
without it, so it is imported only where an image is made. Nothing here downloads a browser.
"""

from __future__ import annotations

import warnings

from workbench.errors import WorkbenchError

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
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                kaleido.start_sync_server(silence_warnings=True)
        except browser_errors() as err:
            first = str(err).splitlines()[0][:160] if str(err) else type(err).__name__
            raise WorkbenchError(f"static export (pdf, svg, png) needs Chromium, which kaleido could not start ({first}); "
                                 f"{NO_BROWSER}") from None
        return self

    def __exit__(self, *exc) -> None:
        import kaleido  # noqa: PLC0415 -- optional (the dev extra); imported by __enter__

        kaleido.stop_sync_server(silence_warnings=True)
