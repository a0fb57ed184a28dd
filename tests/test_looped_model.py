"""`workbench.models.looped.LoopedModel`: every looped model offers the probes one interface, and what differs
between kinds of model is declared (`supports`, `unsupported`), never asked with getattr / hasattr."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from workbench.loop.config import Block
from workbench.models.looped import CAPABILITIES, LoopedModel, lacking
from workbench.models.native import FAMILIES
from workbench.models.native.contract import NativeLoopedLM
from workbench.probes import PROBES, NotApplicable, get_probe
from workbench.probes.battery import run_probe

ROOT = Path(__file__).resolve().parents[1] / "workbench"
READERS = [*sorted((ROOT / "probes").glob("*.py")), ROOT / "lenses.py", ROOT / "generation.py"]


@pytest.fixture(scope="module")
def models():
    from workbench.loop.config import RetrofitConfig
    from workbench.loop.surgery import retrofit
    from workbench.models import load_base, load_looped

    base, _ = load_base("tiny-llama")
    return {"retrofit": retrofit(base, RetrofitConfig(block=Block(2, 4), max_loops=4)),
            "tiny-inkling2-loop": load_looped("tiny-inkling2-loop")[0],
            "tiny-hrm-text": load_looped("tiny-hrm-text")[0], "tiny-ouro": load_looped("tiny-ouro")[0]}


def test_every_kind_of_looped_model_is_a_looped_model(models):
    for name, model in models.items():
        assert isinstance(model, LoopedModel), name
        assert model.supports <= set(CAPABILITIES), name
        assert set(model.unsupported) == set(CAPABILITIES) - model.supports, name   # a reason for each lack
        assert model.final_norm is not None and model.all_cycles_with_grad() is not None
    assert models["retrofit"].native_loops is None and models["tiny-hrm-text"].native_loops == 2
    assert all(issubclass(f, NativeLoopedLM) for f in FAMILIES.values())


def test_a_probe_that_requires_a_capability_is_not_applicable_with_the_models_reason(models):
    required = {name: get_probe(name).requires for name in PROBES if get_probe(name).requires}
    assert required == {"identity": ("base_identity",), "gradient_audit": ("trained_adapters",),
                        "latency": ("dense_loop_cost",)}
    native = models["tiny-hrm-text"]
    assert lacking(native, ["base_identity", "trained_adapters"]) == ["base_identity", "trained_adapters"]
    assert lacking(models["retrofit"], list(CAPABILITIES)) == []
    with pytest.raises(NotApplicable, match="no base to reproduce at loop 1"):
        run_probe("identity", native, None, [], {}, {})


def model_queries(path: Path) -> list[str]:
    """Each `getattr(model, ...)` / `hasattr(model, ...)` (or on `looped`) in a file: asking a model what it has."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id in ("model", "looped")):
            found.append(f"{path.name}:{node.lineno}")
    return found


def test_probes_lenses_and_generation_read_the_interface_not_getattr(tmp_path):
    assert [q for f in READERS for q in model_queries(f)] == []
    planted = tmp_path / "planted.py"
    planted.write_text("def run(model):\n    return getattr(model, 'native_loops', None)\n")
    assert model_queries(planted) == ["planted.py:2"]
