"""The one exception type the CLI turns into a one-line message and exit status 2."""

import contextlib


class WorkbenchError(Exception):
    """A user-facing error: bad input, a refused operation, a file that fails its check.

    The message is one line that names what was given and what is accepted.
    """


@contextlib.contextmanager
def user_files(spec: str, accepted: str):
    """Turns a library's error on a user's model files (truncated weights, a broken config) into one line
    ending in `accepted` (what the caller takes): the one handler of the base and native model loaders.

    The GGUF header is checked first by `workbench.models.gguf_header`, so nothing here allocates for what a
    file merely declares; this catches what the readers find after that.
    """
    from huggingface_hub.errors import StrictDataclassError  # noqa: PLC0415 - every module imports errors;
    from safetensors import SafetensorError  # noqa: PLC0415 - these load with the model loaders only

    try:
        yield
    except WorkbenchError:
        raise
    # a config's zero head count divides by zero, a None size has no attribute, a zero vocabulary fails torch's
    # own assertion on the padding index, transformers' config dataclasses validate fields (StrictDataclassError)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ArithmeticError, RuntimeError, AssertionError,
            SafetensorError, StrictDataclassError) as err:
        lines = str(err).strip().splitlines()
        first = lines[0][:200] if lines else "no message"
        raise WorkbenchError(f"model '{spec}' cannot be loaded ({type(err).__name__}: {first}); "
                             f"{accepted}") from None
