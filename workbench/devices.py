"""`--device`: which device a command computes on, checked before anything loads or is written.

`auto` is the first CUDA GPU when torch sees one, else the CPU; `cpu`, `cuda` (the current GPU)
and `cuda:N` name one. A name the machine cannot honour (`cuda` without a GPU, `cuda:7` on a
one-GPU machine, a typo) is a one-line `WorkbenchError` (exit status 2). The record written into
provenance and summaries says what was asked, what was used and the device's name.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from workbench.errors import WorkbenchError

if TYPE_CHECKING:   # torch loads when a device is resolved, not when the CLI starts
    import torch

DEVICE_HELP = "auto (a CUDA GPU when torch sees one, else the CPU), cpu, cuda or cuda:N."


def _gpus() -> int:
    import torch  # noqa: PLC0415 - torch loads when a device is resolved, not when the CLI starts

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_device(spec: str | torch.device | None = "auto") -> torch.device:
    """Returns the torch device `spec` names on this machine.

    Args:
        spec: "auto", "cpu", "cuda", "cuda:N", or a torch.device (used as given: tests pass
            `workbench.devicecheck.SIMULATED`). None means "auto".
    Raises:
        WorkbenchError: a malformed name, CUDA without a visible GPU, or an index past the last GPU.
    """
    import torch  # noqa: PLC0415 - torch loads when a device is resolved, not when the CLI starts

    if isinstance(spec, torch.device):
        return spec
    spec = "auto" if spec is None else str(spec).strip().lower()
    if spec == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if _gpus() else torch.device("cpu")
    if spec == "cpu":
        return torch.device("cpu")
    m = re.fullmatch(r"cuda(?::(\d+))?", spec)
    if m is None:
        raise WorkbenchError(f"--device '{spec}' is not a device name; accepted: {DEVICE_HELP}")
    n = _gpus()
    if n == 0:
        built = torch.version.cuda
        raise WorkbenchError(f"--device {spec}: torch sees no CUDA GPU here (torch {torch.__version__}, "
                             + (f"built for CUDA {built}" if built else "a CPU-only build") + "); use --device cpu")
    index = int(m.group(1)) if m.group(1) is not None else torch.cuda.current_device()
    if index >= n:
        raise WorkbenchError(f"--device {spec}: this machine has {n} CUDA GPU{'s' if n > 1 else ''} "
                             f"(cuda:0{f'..cuda:{n - 1}' if n > 1 else ''})")
    return torch.device("cuda", index)


def device_of(model) -> torch.device:
    """The device of the model's parameters (the CPU for a parameterless stand-in)."""
    try:
        return next(model.parameters()).device
    except (AttributeError, StopIteration):
        return resolve_device("cpu")


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model name."""
    import torch  # noqa: PLC0415 - torch loads when a device is resolved, not when the CLI starts

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    from workbench.precision import detect_hardware  # noqa: PLC0415 - precision imports torch (see above)

    return detect_hardware("cpu").name


def device_record(spec, device: torch.device) -> dict:
    """{"requested", "used", "name"} for provenance and summaries."""
    return {"requested": str(spec) if spec is not None else "auto", "used": str(device), "name": device_name(device)}


def check_device(spec) -> None:
    """Validates a --device value early (before a model loads or a directory is written)."""
    resolve_device(spec)


def training_accelerator(spec=None):
    """(an `accelerate.Accelerator`, the device this process trains on) for a --device value.

    One process trains on the device named. Under `accelerate launch` with several processes each
    rank takes the device accelerate gives it (`cuda:<local rank>`, or the CPU over gloo), so a
    single GPU's index is refused there.
    """
    import torch  # noqa: PLC0415 - torch loads when a device is resolved, not when the CLI starts
    from accelerate import Accelerator  # noqa: PLC0415 - as torch

    device = resolve_device(spec)
    acc = Accelerator(cpu=device.type != "cuda")
    if acc.num_processes > 1:
        if isinstance(spec, str) and re.fullmatch(r"cuda:\d+", spec.strip().lower()):
            raise WorkbenchError(f"--device {spec}: under accelerate launch every process takes its own GPU; "
                                 "use --device auto or cuda")
        return acc, acc.device
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return acc, device
