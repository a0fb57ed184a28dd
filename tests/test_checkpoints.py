"""A `--checkpoint` / `--model` spec is parsed once into a `Checkpoint`, and its precision travels with it: a native
looped model asked for in bf16 is stored and read in bf16, within the tolerance its reference tests state."""

import json

import pytest
import torch
from safetensors.torch import load_file

from tests.test_cli_errors import invoke
from tests.test_native_cli import saved_hrm  # noqa: F401  (the fixture)
from tests.test_native_ouro import BF16_VS_FP32
from tests.test_native_raven import BF16_TOLERANCE, CHECKPOINT, FIXTURE
from workbench import checkpoints, runs
from workbench import precision as P
from workbench.checkpoints import UNTRAINED, Checkpoint, parse_checkpoint, parse_model
from workbench.defaults import resolve_run
from workbench.errors import WorkbenchError
from workbench.loop.config import Block
from workbench.runs import load_checkpoint

KEEPER = resolve_run("smollm2-chase")   # the shipped keeper's directory, wherever its copy is
TOLERANCE = {"tiny-raven": BF16_TOLERANCE, "tiny-ouro": BF16_VS_FP32}   # the families' own stated bf16 tolerances
PROMPT = "Start at A. Apply the table 2 times.\nAnswer:"


def test_each_spec_is_parsed_into_its_kind():
    assert (KEEPER / "retrofit.json").is_file()
    assert parse_checkpoint("smollm2-chase") == Checkpoint("smollm2-chase", "run", run_dir=KEEPER)
    assert parse_checkpoint("tiny-raven", "bf16") == Checkpoint("tiny-raven", "native", family="huginn_raven",
                                                                precision="bf16")
    assert parse_checkpoint(str(CHECKPOINT)).family == "huginn_raven"
    assert parse_checkpoint(f"{UNTRAINED}smollm2-chase") == Checkpoint(f"{UNTRAINED}smollm2-chase", "untrained",
                                                                      run_dir=KEEPER)
    assert parse_checkpoint("untrained:tiny-llama:2:4") == Checkpoint("untrained:tiny-llama:2:4", "untrained",
                                                                      base="tiny-llama", block=Block(2, 4))
    assert parse_model("tiny-llama", "2:4") == parse_checkpoint("untrained:tiny-llama:2:4")
    assert parse_model("tiny-ouro") == parse_checkpoint("tiny-ouro")


@pytest.mark.parametrize("parse, message", [
    (lambda: parse_checkpoint("untrained:tiny-llama:2"), "is not untrained:RUN_DIR or untrained:BASE:A:B"),
    (lambda: parse_checkpoint("tiny-raven", "fp16"), "precision 'fp16' is not accepted; accepted: fp32, bf16"),
    (lambda: parse_model("tiny-llama"), "'tiny-llama' is a base model: give --block A:B"),
    (lambda: parse_model("tiny-raven", "1:2"), "'tiny-raven' has its own block (drop --block)"),
    (lambda: parse_model("smollm2-chase", "1:2"), "'smollm2-chase' has its own block (drop --block)"),
    (lambda: parse_model("tiny-llama", "2-4"), "--block '2-4' is not A:B"),
])
def test_a_bad_spec_is_one_line_before_anything_loads(parse, message):
    with pytest.raises(WorkbenchError, match="^[^\n]*" + message.replace("(", r"\(").replace(")", r"\)")):
        parse()


def test_loading_a_parsed_spec_asks_nothing_again(monkeypatch):
    """`load_checkpoint` reads the keeper's directory and the family from the value: resolving or sniffing again
    would mean a second parse."""
    checkpoint = parse_checkpoint("untrained:tiny-llama:2:4")
    for module, name in ((checkpoints, "resolve_run"), (checkpoints, "native_family"), (runs, "resolve_run")):
        monkeypatch.setattr(module, name, lambda *a, **k: pytest.fail("a parsed checkpoint was parsed again"))
    looped, _, info = load_checkpoint(checkpoint)
    assert (looped.a, looped.b) == (2, 4) and info["path"] == "untrained:tiny-llama:2:4" and info["base"] == "tiny-llama"


@pytest.mark.parametrize("spec", ["tiny-raven", "tiny-ouro"])
def test_a_tiny_native_model_in_bf16_is_stored_in_bf16_within_its_stated_tolerance(spec):
    exact, tok, exact_info = load_checkpoint(parse_checkpoint(spec))
    halved, _, info = load_checkpoint(parse_checkpoint(spec, "bf16"))
    assert {p.dtype for p in exact.parameters()} == {torch.float32}
    assert {p.dtype for p in halved.parameters()} == {torch.bfloat16} and halved.precision == "bf16"
    assert info["base_sha256"] != exact_info["base_sha256"]   # the weights it holds are not the fp32 ones
    ids = tok([PROMPT], return_tensors="pt").input_ids
    with torch.no_grad():
        for k in (1, halved.native_loops):
            got = halved(ids, loops=k).logits
            assert got.dtype == torch.bfloat16
            assert float((got.float() - exact(ids, loops=k).logits).abs().max()) <= TOLERANCE[spec], k


def test_a_native_directory_in_bf16_stays_within_the_tolerance_of_the_reference():
    ref = load_file(FIXTURE / "reference.safetensors")
    looped, _, _ = load_checkpoint(parse_checkpoint(str(CHECKPOINT), "bf16"))
    assert {p.dtype for p in looped.parameters()} == {torch.bfloat16}
    with torch.no_grad():
        for k in (1, 8, 32):
            got = looped(ref["a.ids"], loops=k, init_state=ref["a.s0"]).logits
            assert float((got.float() - ref[f"a.logits.{k}"]).abs().max()) <= BF16_TOLERANCE, k


@pytest.mark.slow   # three batteries on native models
@pytest.mark.parametrize("spec", ["tiny-raven", "tiny-ouro", "saved_hrm"])
def test_probe_runs_a_native_model_in_bf16(capsys, monkeypatch, tmp_path, spec, request):
    """The CLI's --precision reaches the native model's storage: the tiny families and a saved directory."""
    spec = request.getfixturevalue(spec) if spec == "saved_hrm" else spec
    monkeypatch.setattr(P, "detect_hardware", lambda device="cpu": P.Hardware("cpu", "a CPU with bf16 units",
                                                                               ["avx512_bf16"], True))
    out = tmp_path / "res"
    code, _, err = invoke(capsys, monkeypatch, "probe", "--checkpoint", spec, "--out", out, "--precision", "bf16",
                          "--only", "loop_accuracy", "--quiet")
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"]["dtype"] == "bfloat16" and summary["precision"]["used"] == "bf16"
    assert summary["checkpoint"]["kind"] == "native" and "headline" in summary["probes"]["loop_accuracy"]
