"""Numeric precision of a retrofit: fp32 (exact, the default for identity) or bf16 mixed precision.

bf16 here means what a GPU user runs: the *frozen* weights (every parameter with
requires_grad False when `apply_precision` is called) are stored in bf16 once, so no call
casts them again; trainable parameters and their optimizer state stay fp32; `LoopedLM.forward`
and `.read` run under `torch.autocast(dtype=bfloat16)`, and the trainer's losses and every
softmax the workbench writes itself (attention's own is fp32 in HF eager attention, Loop
Memory Attention's is upcast) are taken in fp32. Scores, logits and states leave the model
as fp32 tensors, so probes and readers see the same dtype in both precisions.

The hardware decides whether bf16 is worth it: a CPU without bf16 units (AVX512-BF16 or AMX)
emulates bf16 matmuls slower than fp32. `resolve_precision` then falls back to fp32 with a
printed warning, and the fallback is recorded wherever the precision is recorded.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from workbench.errors import WorkbenchError

PRECISIONS = ("fp32", "bf16")
PRECISION_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}   # a model stored whole in a precision


@dataclass(frozen=True)
class Hardware:
    """What the machine offers for bf16: the device, its name and which bf16 units it has."""

    device: str             # "cpu" or "cuda"
    name: str               # CPU model name or GPU name
    bf16_units: list[str]   # e.g. ["avx512_bf16", "amx_bf16"], or ["cuda"]; [] when none
    bf16_supported: bool    # torch will run bf16 matmuls on native units (oneDNN / CUDA)

    def describe(self) -> str:
        units = ", ".join(self.bf16_units) if self.bf16_units else "none"
        return f"{self.device}: {self.name}; bf16 units: {units}"

    def to_dict(self) -> dict:
        return asdict(self)


def _cpu_flags_and_name() -> tuple[set[str], str]:
    flags: set[str] = set()
    name = "unknown CPU"
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return flags, name
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "flags" and not flags:
            flags = set(value.split())
        elif key == "model name" and name == "unknown CPU":
            name = value.strip()
    return flags, name


def detect_hardware(device: str | torch.device = "cpu") -> Hardware:
    """Returns what `device` offers for bf16 (CPU flags from /proc/cpuinfo, or the CUDA device)."""
    device = torch.device(device)
    if device.type == "cuda":
        return Hardware("cuda", torch.cuda.get_device_name(device), ["cuda"], torch.cuda.is_bf16_supported())
    flags, name = _cpu_flags_and_name()
    units = sorted(f for f in flags if f in ("avx512_bf16", "amx_bf16", "amx_tile"))
    try:
        onednn = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        onednn = False
    native = any(u in units for u in ("avx512_bf16", "amx_bf16"))
    return Hardware("cpu", name, units, native and onednn)


def resolve_precision(requested: str, device: str | torch.device = "cpu", warn=None) -> tuple[str, dict]:
    """Returns (precision to use, record) for a requested precision on this hardware.

    bf16 on hardware without bf16 units falls back to fp32 with a printed warning (never a
    silently slow emulated bf16). The record says what was asked, what is used, and why.

    Raises:
        WorkbenchError: an unknown precision name.
    """
    if requested not in PRECISIONS:
        raise WorkbenchError(f"precision '{requested}' is not accepted; accepted: {', '.join(PRECISIONS)}")
    hw = detect_hardware(device)
    used, reason = requested, None
    if requested == "bf16" and not hw.bf16_supported:
        used = "fp32"
        reason = f"no bf16 units ({hw.describe()}): bf16 would be emulated, slower than fp32"
        (warn or (lambda m: print(m, file=sys.stderr)))(f"warning: precision bf16 requested, using fp32: {reason}")
    return used, {"requested": requested, "used": used, "fallback_reason": reason, "hardware": hw.to_dict()}


def apply_precision(model: torch.nn.Module, precision: str) -> int:
    """Stores the frozen parameters of `model` in bf16 (once) and turns on autocast; returns the count cast.

    Only parameters with requires_grad False are cast: call it after choosing what trains.
    fp32 is a no-op. A model holding a `precision` attribute (LoopedLM) runs its forward and
    read under autocast when it is "bf16".
    """
    if precision not in PRECISIONS:
        raise WorkbenchError(f"precision '{precision}' is not accepted; accepted: {', '.join(PRECISIONS)}")
    cast = 0
    if precision == "bf16":
        with torch.no_grad():
            for p in model.parameters():
                if not p.requires_grad and p.dtype == torch.float32:
                    p.data = p.data.to(torch.bfloat16)
                    cast += 1
    if hasattr(model, "precision"):
        model.precision = precision
    return cast


def autocast(precision: str, device_type: str = "cpu"):
    """The autocast context of a precision (a null context for fp32)."""
    if precision == "bf16":
        return torch.autocast(device_type=device_type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
