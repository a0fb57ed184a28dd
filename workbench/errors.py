"""The one exception type the CLI turns into a one-line message and exit status 2."""


class WorkbenchError(Exception):
    """A user-facing error: bad input, a refused operation, a file that fails its check.

    The message is one line that names what was given and what is accepted.
    """
