"""Safe loading: tensors only through safetensors, no pickle, no weights_only=False (scan the package)."""

import re
from pathlib import Path

import workbench

PACKAGE = Path(workbench.__file__).parent
PATTERNS = [r"\bimport pickle\b", r"\bpickle\.", r"weights_only\s*=\s*False", r"\bimport dill\b",
            r"\bjoblib\b", r"torch\.save\("]


def scan(paths) -> list[str]:
    """Returns one line per unsafe (de)serialisation found in `paths`."""
    bad = []
    for path in paths:
        text = path.read_text()
        for pat in PATTERNS:
            bad += [f"{path.name}: {m.group(0)}" for m in re.finditer(pat, text)]
        for m in re.finditer(r"torch\.load\(([^)]*)\)", text):
            if "weights_only=True" not in m.group(1):
                bad.append(f"{path.name}: torch.load without weights_only=True")
    return bad


def test_package_has_no_unsafe_loading():
    sources = sorted(PACKAGE.rglob("*.py"))
    assert len(sources) > 10
    assert scan(sources) == []


def test_scanner_catches_violations(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import pickle\nx = torch.load(p)\ny = torch.load(p, weights_only=False)\ntorch.save(x, p)\n")
    found = scan([bad])
    assert len(found) == 5, found  # import, torch.load twice (one also weights_only=False), torch.save
