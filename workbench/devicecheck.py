"""Wrong-device tensors found on a CPU: a stand-in accelerator that is the CPU under another name.

A GPU run fails where a tensor made on the host meets one on the accelerator (`torch.arange(T)`
beside CUDA losses, a CPU tensor handed to an NCCL reduce, `.numpy()` of a CUDA tensor). None of
these fail on a CPU, where every tensor shares the one device. `DeviceCheck` makes them visible
there: inside it, the run's device is `SIMULATED` (``cpu:0``, which computes on the CPU exactly),
and every tensor carries where it would live on a GPU machine:

- *host*: made by a factory call (`torch.tensor`, `arange`, `zeros`, `randn`, `from_numpy`, ...)
  without a device, or with ``device="cpu"``; moved with ``.cpu()`` / ``.to("cpu")``; or computed
  from host tensors only (a tokenizer's output is host until it is moved).
- *device*: a parameter, a tensor made before the check began (the model, moved there by the
  code under test), made with ``device=SIMULATED`` or ``device=x.device`` of a device tensor,
  moved there with ``.to(...)``, or computed from any device tensor.

``x.device`` answers ``cpu:0`` for a device tensor and ``cpu`` for a host one, so code that
follows another tensor's device is followed exactly. A violation is what CUDA refuses: an
operation mixing a host tensor of one or more dimensions with a device tensor (a 0-d host tensor
is a scalar CUDA accepts, and host index tensors may index a device tensor), indexing a host
tensor with a device index, ``.numpy()`` of a device tensor, and, through `checked_reduce`,
a host tensor given to a collective. Violations are recorded with the line of workbench code
that made them, not raised, so one run lists all of them.

Not seen: tensors made in C++ outside torch's Python dispatch (safetensors' loader, autograd's
gradients; both are treated as device) and ``torch.tensor(..., device=x.device)`` of a host
``x`` read before the check. The test tier that uses this is `tests/test_devices.py`.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode

SIMULATED = torch.device("cpu", 0)
"""The stand-in accelerator: the CPU under the index 0, told apart from the host ``cpu``."""

HOST = torch.device("cpu")

_FACTORIES = frozenset(getattr(torch, n) for n in (
    "tensor", "as_tensor", "asarray", "arange", "range", "zeros", "ones", "full", "empty", "empty_strided",
    "rand", "randn", "randint", "randperm", "normal", "linspace", "logspace", "eye", "tril_indices",
    "triu_indices", "scalar_tensor", "bernoulli", "multinomial") if hasattr(torch, n))
_FLAG = "_workbench_host"
_ROOT = __name__.rsplit(".", 1)[0]   # "workbench"


def _is_host(t) -> bool:
    return isinstance(t, torch.Tensor) and not isinstance(t, torch.nn.Parameter) and t.__dict__.get(_FLAG, False)


def _mark(obj, host: bool):
    if isinstance(obj, torch.Tensor) and not isinstance(obj, torch.nn.Parameter):
        try:
            obj.__dict__[_FLAG] = host
        except (AttributeError, TypeError):   # a tensor subclass without a __dict__
            pass
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            _mark(o, host)
    elif isinstance(obj, dict):
        for o in obj.values():
            _mark(o, host)
    return obj


def _tensors(obj, out: list) -> list:
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            _tensors(o, out)
    elif isinstance(obj, dict):
        for o in obj.values():
            _tensors(o, out)
    return out


def _device_arg(value) -> bool | None:
    """True: the simulated device (or an accelerator); False: the host; None: no device named."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return not _is_host(value)
    if isinstance(value, (str, torch.device, int)):
        d = torch.device(value) if not isinstance(value, int) else torch.device("cuda", value)
        return not (d.type == "cpu" and d.index is None)
    return None


def _where(depth: int = 3) -> str:
    """The innermost callers outside torch, installed packages and this module, innermost first:
    "file:line (function) <- file:line (function) ..." (`depth` of them)."""
    found = []
    for f in reversed(traceback.extract_stack()[:-2]):
        name = f.filename.replace("\\", "/")
        if "site-packages/" in name or "/torch/" in name or name.endswith("devicecheck.py") or name.startswith("<"):
            continue
        for root in (f"/{_ROOT}/", "/tests/"):
            if root in name:
                name = name[name.rfind(root) + 1:]
                break
        found.append(f"{name}:{f.lineno} ({f.name})")
        if len(found) == depth:
            break
    return " <- ".join(found) or "?"


@dataclass
class Violation:
    """One operation CUDA would refuse: what it was and the workbench line that called it."""

    op: str
    where: str
    detail: str

    def __str__(self) -> str:
        return f"{self.where}: {self.op}: {self.detail}"


class DeviceCheck(TorchFunctionMode):
    """A torch function mode recording every operation that would mix host and device tensors on a GPU.

    Use as a context manager around code whose model is already on `SIMULATED` (or is moved there
    inside); read `violations` (distinct by line and operation) afterwards, or call `assert_clean`.
    """

    def __init__(self):
        super().__init__()
        self.violations: list[Violation] = []
        self._seen: set[tuple[str, str]] = set()
        self._from_numpy = None

    def __enter__(self):
        self._from_numpy = torch.from_numpy   # not dispatched through torch functions: wrapped instead

        def from_numpy(array):
            return _mark(self._from_numpy(array), True)

        torch.from_numpy = from_numpy
        return super().__enter__()

    def __exit__(self, *exc):
        torch.from_numpy = self._from_numpy
        return super().__exit__(*exc)

    def record(self, op: str, detail: str) -> None:
        where = _where()
        if (where, op) not in self._seen:
            self._seen.add((where, op))
            self.violations.append(Violation(op, where, detail))

    def assert_clean(self) -> None:
        """Raises AssertionError listing every violation (one line each)."""
        if self.violations:
            raise AssertionError(f"{len(self.violations)} operation(s) would mix host and device tensors on a GPU:\n"
                                 + "\n".join(str(v) for v in self.violations))

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        if func == torch.Tensor.device.__get__:
            return HOST if _is_host(args[0]) else SIMULATED
        if func in _FACTORIES:
            where = _device_arg(kwargs.get("device"))
            if func in (torch.as_tensor, torch.asarray) and where is None and isinstance(args[0], torch.Tensor):
                where = not _is_host(args[0])   # an existing tensor keeps its place
            if where:
                kwargs = {**kwargs, "device": HOST}
            return _mark(func(*args, **kwargs), not where)
        if name in ("to", "cuda", "cpu", "type_as", "new_tensor", "new_zeros", "new_ones", "new_full",
                    "new_empty", "zeros_like", "ones_like", "full_like", "empty_like", "rand_like",
                    "randn_like", "randint_like"):
            return self._placed(func, name, args, kwargs)
        if name in ("numpy", "__array__") and args and not _is_host(args[0]):
            self.record(name, f"numpy of a device tensor {tuple(args[0].shape)} (needs .cpu() first)")
            return func(*args, **kwargs)
        if name == "copy_":   # copies across devices
            return func(*args, **kwargs)
        tensors = _tensors(list(args) + list(kwargs.values()), [])
        if name == "__getitem__":
            index = _tensors(args[1:], [])
            if _is_host(args[0]) and any(not _is_host(i) for i in index):
                self.record(name, f"host tensor {tuple(args[0].shape)} indexed by a device tensor")
            return _mark(func(*args, **kwargs), _is_host(args[0]))
        host = [t for t in tensors if _is_host(t)]
        device = [t for t in tensors if not _is_host(t)]
        if device and any(t.dim() > 0 for t in host):
            shapes = ", ".join(str(tuple(t.shape)) for t in host if t.dim() > 0)
            self.record(name, f"host tensor(s) {shapes} meet device tensor(s) {tuple(device[0].shape)}")
        out = func(*args, **kwargs)
        if tensors and out is not (args[0] if args else None):
            _mark(out, not device)
        return out

    def _placed(self, func, name, args, kwargs):
        """`.to` / `.cpu` / `.cuda` / `new_*` / `*_like`: the result's place is the one asked, else the source's."""
        src = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if name == "cpu":
            where = False
        elif name == "cuda":
            where = True
        else:
            asked = kwargs.get("device")
            if asked is None and name in ("to", "type_as"):
                asked = next((a for a in args[1:] if isinstance(a, (str, torch.device, torch.Tensor))), None)
            where = _device_arg(asked)
        if where is None:
            where = src is not None and not _is_host(src)
        if name == "cuda":
            func, args, kwargs = torch.Tensor.to, args[:1], {"device": HOST}
        else:   # the real call stays on the CPU
            args = tuple(HOST if isinstance(a, (str, torch.device)) else a for a in args)
            if "device" in kwargs:
                kwargs = {**kwargs, "device": HOST}
        out = func(*args, **kwargs)
        if out is src and _is_host(src) == (not where):
            return out
        if out is src:   # already in place on the CPU: a moved copy, so the original keeps its place
            out = out.clone()
        return _mark(out, not where)


class checked_reduce:
    """Wraps an `accelerate.Accelerator` so that its collectives record a host tensor as a violation.

    NCCL reduces tensors on the GPU only; gloo (the CPU tests) accepts host tensors, so the
    two-process CPU test cannot see this. `ranks` makes the wrapped accelerator report that many
    processes (rank 0, every other rank contributing zeros), so a one-process run takes the
    collective code paths.
    """

    def __init__(self, acc, check: DeviceCheck, ranks: int = 2):
        self._acc, self._check, self.num_processes = acc, check, ranks

    def __getattr__(self, name):
        return getattr(self._acc, name)

    @property
    def process_index(self) -> int:
        return 0

    @property
    def is_main_process(self) -> bool:
        return True

    def reduce(self, tensor, reduction: str = "sum"):
        for t in _tensors(tensor, []):
            if _is_host(t):
                self._check.record("reduce", f"host tensor {tuple(t.shape)} given to a collective (NCCL needs "
                                             "it on the GPU)")
        return tensor

    def gather(self, tensor):
        return self.reduce(tensor)


__all__ = ["HOST", "SIMULATED", "DeviceCheck", "Violation", "checked_reduce"]
