"""A user's own Raven or Ouro directory through every command that takes one, and Raven's initial state on the CLI.

The bad-input cases are generated: each `Case` turns a readable copy of a committed tiny fixture
(tests/fixtures/raven, tests/fixtures/ouro) into a broken directory, and every (case, family, command) is a test:
one line on stderr, exit 2, nothing written; a directory that carries its own modeling code is read (its weights,
never its code, and a log line says so). The CLI runs in-process (`tests.test_cli_errors.invoke`).
"""

import json
import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.test_cli_errors import assert_clean_error, invoke
from tests.test_native_cli import MANIFEST
from workbench.models import load_looped
from workbench.models.native import OWN_FAMILIES, TINY_NATIVE
from workbench.models.native.raven import rope_table
from workbench.models.native.raven_files import RavenConfig

FIXTURES = Path(__file__).parent / "fixtures"
CHECKPOINTS = {"raven": FIXTURES / "raven" / "checkpoint", "ouro": FIXTURES / "ouro" / "tiny-ouro"}
TOKENIZER = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")   # the Raven fixture's (260 tokens)
CONTEXT = 1024   # positions of the readable copies: the battery's rows fit
SENTINEL = "CODE-RAN"
PROMPT = "the cat"


# ----------------------------------------------------------------------------- the readable directories
def _config(path: Path, **changes) -> None:
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    (path / "config.json").write_text(json.dumps(config))


def _shard_of(path: Path, tensor: str) -> Path:
    return path / json.loads((path / "model.safetensors.index.json").read_text())["weight_map"][tensor]


def _edit_tensors(path: Path, names: list[str], edit: Callable[[str, torch.Tensor], torch.Tensor]) -> None:
    for shard in {_shard_of(path, n) for n in names}:
        tensors = load_file(str(shard))
        save_file({k: edit(k, v) if k in names else v for k, v in tensors.items()}, str(shard))


def _readable_raven(out: Path) -> Path:
    """The Raven fixture with CONTEXT positions (its stored RoPE table extended)."""
    shutil.copytree(CHECKPOINTS["raven"], out)
    _config(out, block_size=CONTEXT)
    config = json.loads((out / "config.json").read_text())
    table = rope_table(RavenConfig(n_embd=config["n_embd"], n_heads=config["n_heads"], block_size=CONTEXT,
                                   rope_base=config["rope_base"]))
    _edit_tensors(out, ["freqs_cis"], lambda _, __: table)
    return out


def _readable_ouro(out: Path) -> Path:
    """The weights-only Ouro fixture with the Raven fixture's tokenizer: its vocabulary widened to that tokenizer's
    (seeded rows appended to the embedding and the head) and CONTEXT positions."""
    shutil.copytree(CHECKPOINTS["ouro"], out)
    for name in TOKENIZER:
        shutil.copy(CHECKPOINTS["raven"] / name, out / name)
    vocab = json.loads((CHECKPOINTS["raven"] / "config.json").read_text())["vocab_size"]
    g = torch.Generator().manual_seed(0)

    def widen(_, t):
        return torch.cat([t, 0.5 / t.shape[1] ** 0.5 * torch.randn(vocab - t.shape[0], t.shape[1], generator=g)])

    _edit_tensors(out, ["model.embed_tokens.weight", "lm_head.weight"], widen)
    _config(out, vocab_size=vocab, max_position_embeddings=CONTEXT)
    return out


@pytest.fixture(scope="module")
def readable(tmp_path_factory):
    root = tmp_path_factory.mktemp("readable")
    return {"raven": _readable_raven(root / "raven"), "ouro": _readable_ouro(root / "ouro")}


def test_the_readable_copies_load_and_read_text(readable):
    for family, path in readable.items():
        looped, tok = load_looped(path)
        ids = tok([PROMPT], return_tensors="pt").input_ids
        assert looped.family == next(f.model_type for f in OWN_FAMILIES.values() if f.name == family)
        assert torch.isfinite(looped(ids, loops=2).logits).all()


# ----------------------------------------------------------------------------- the generated bad-input cases
@dataclass(frozen=True)
class Case:
    """A bad input: `make` breaks a readable copy in place; `fragments` name what the one-line error says."""

    name: str
    make: Callable[[Path, str], None]
    fragments: Callable[[Path, str], tuple[str, ...]]
    families: tuple[str, ...] = ("raven", "ouro")
    args: dict = field(default_factory=dict)   # command -> extra arguments (the input is an option, not the files)
    tiny: bool = False   # read the family's tiny model (its tokenizer spells the battery's symbols in one token)


def _intermediate(path, family):
    _config(path, intermediate_size=48)


def _drop_first_shard(path, family):
    first = sorted(set(json.loads((path / "model.safetensors.index.json").read_text())["weight_map"].values()))[0]
    (path / first).unlink()


def _first_shard_name(path, family):
    return sorted(set(json.loads((CHECKPOINTS[family] / "model.safetensors.index.json").read_text())
                      ["weight_map"].values()))[0]


def _add_code(path, family):
    (path / f"modeling_{family}.py").write_text(f"open({str(path / SENTINEL)!r}, 'w').close()\n")


def _more_tokens(path, family):
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(path)
    tok.add_tokens([f"<extra_{i}>" for i in range(8)])
    tok.save_pretrained(path)


def _weights_only(path, family):
    for name in TOKENIZER:
        (path / name).unlink()


STEP_FIELD = {"raven": "mean_recurrence", "ouro": "total_ut_steps"}
MLP_TENSOR = {"raven": "transformer.prelude.0.mlp.fc.weight", "ouro": "model.layers.0.mlp.gate_proj.weight"}
TOO_MANY = 10_000   # steps past every family's max_loops (twice its native count)

CASES = (
    Case("another-architecture", lambda p, f: _config(p, model_type="mamba"),
         lambda p, f: (f"model '{p}' has architecture 'mamba'", "neither as a looped family")),
    Case("config-disagrees-with-tensors", _intermediate, lambda p, f: ("tensor", MLP_TENSOR[f], "config")),
    Case("missing-shard", _drop_first_shard, lambda p, f: (f"names shard '{_first_shard_name(p, f)}'", "not a file")),
    Case("config-step-count", lambda p, f: _config(p, **{STEP_FIELD[f]: 0}),
         lambda p, f: (STEP_FIELD[f], "0", "positive integer")),
    Case("steps-past-the-family", lambda p, f: None, lambda p, f: (f"loops={TOO_MANY}", "is outside 1.."),
         args={"generate": ["--loops", str(TOO_MANY)], "lens": ["--loops", str(TOO_MANY)], "probe": "battery"},
         tiny=True),
    Case("exit-threshold", lambda p, f: _config(p, early_exit_threshold=1.5),
         lambda p, f: ("early_exit_threshold is 1.5", "(0, 1]"), families=("ouro",)),
    Case("tokenizer-larger-than-embedding", _more_tokens,
         lambda p, f: ("its tokenizer has 268 tokens", "embedding has 260 rows")),
    Case("weights-only", _weights_only, lambda p, f: ("has no tokenizer files (weights only)",)),
)
NOT_APPLICABLE = ("a family the workbench writes itself",)   # identity on a family written here: refused by name


def _command(name: str, path: Path, out: Path, extra) -> list:
    """The command line of `name` on directory `path`, writing (if it writes) under `out`."""
    if name == "probe":
        if extra == "battery":
            battery = out.parent / "steps.toml"
            battery.write_text(f'[battery]\nmanifest = "{MANIFEST}"\n[probes.depth_matrix]\nloops = {TOO_MANY}\n')
            return ["probe", "--checkpoint", path, "--out", out, "--battery", battery, "--only", "depth_matrix"]
        return ["probe", "--checkpoint", path, "--out", out, "--only", "identity"]
    if name == "lens":
        return ["lens", path, "--prompt", PROMPT, "--html", out / "lens.html", *(extra or [])]
    if name == "generate":
        return ["generate", path, "--prompt", PROMPT, "--max-new-tokens", "2", *(extra or [])]
    return ["identity", "--model", path]


COMMANDS = ("probe", "lens", "generate", "identity")
GENERATED = [pytest.param(case, family, command, id=f"{case.name}-{family}-{command}")
             for case in CASES for family in case.families for command in COMMANDS]


@pytest.mark.parametrize("case, family, command", GENERATED)
def test_bad_input_is_one_line_exit_2_and_nothing_written(capsys, monkeypatch, tmp_path, readable, case, family,
                                                          command):
    path = tmp_path / family
    shutil.copytree(readable[family], path)
    case.make(path, family)
    out = tmp_path / "out"
    spec = next(f.tiny_name for f in OWN_FAMILIES.values() if f.name == family) if case.tiny else path
    code, _, err = invoke(capsys, monkeypatch, *_command(command, spec, out, case.args.get(command)))
    wanted = case.fragments(path, family)
    if command == "identity" and case.name != "another-architecture":
        wanted = NOT_APPLICABLE
    if case.name == "steps-past-the-family" and command == "probe":   # the battery's loops, after loading's progress
        assert code == 2 and err.strip().splitlines()[-1].startswith("error: "), err
        assert all(f in err.strip().splitlines()[-1] for f in wanted), err
    else:
        assert_clean_error(code, err, *wanted)
    assert not out.exists()


@pytest.mark.parametrize("family", sorted(CHECKPOINTS))
@pytest.mark.parametrize("command", COMMANDS)
def test_a_directory_with_its_own_code_is_read_and_its_code_never_run(capsys, monkeypatch, caplog, tmp_path, readable,
                                                                       family, command):
    path = tmp_path / family
    shutil.copytree(readable[family], path)
    _add_code(path, family)
    out = tmp_path / "out"
    with caplog.at_level(logging.WARNING):   # a warning: the CLI prints it on stderr (pytest's handler holds it here)
        code, _, err = invoke(capsys, monkeypatch, *_command(command, path, out, None))
    assert not (path / SENTINEL).exists()
    if command == "identity":
        assert_clean_error(code, err, *NOT_APPLICABLE)
        return
    assert code == 0 and not err.strip(), err
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert said == [f"model '{path}' carries modeling code (modeling_{family}.py); the workbench reads its config and "
                    "weights only and never imports that code"]
    assert out.exists() or command == "generate"


# ----------------------------------------------------------------------------- Raven's initial state on the CLI
def _generated(capsys, monkeypatch, *extra) -> list[list[int]]:
    code, stdout, err = invoke(capsys, monkeypatch, "generate", "tiny-raven", "--prompt", PROMPT, "--loops", "2,8",
                               "--max-new-tokens", "6", "--json", *extra)
    assert code == 0, err
    return [row["tokens"] for row in json.loads(stdout)["rows"]]


def test_generate_with_the_same_init_seed_agrees_token_for_token_and_another_seed_differs(capsys, monkeypatch):
    first = _generated(capsys, monkeypatch, "--init-seed", "1")
    assert _generated(capsys, monkeypatch, "--init-seed", "1") == first
    assert _generated(capsys, monkeypatch, "--init-seed", "2") != first


def test_generate_from_an_init_state_file_is_the_seeded_state_it_holds(capsys, monkeypatch, tmp_path):
    looped, tok = load_looped("tiny-raven")
    n = len(tok(PROMPT).input_ids)
    s0 = looped.draw_state(torch.arange(n), 5, torch.float32)   # what --init-seed 5 draws for the prompt
    save_file({"s0": s0}, str(tmp_path / "s0.safetensors"))
    given = _generated(capsys, monkeypatch, "--init-state", tmp_path / "s0.safetensors", "--init-seed", "5")
    assert given == _generated(capsys, monkeypatch, "--init-seed", "5")
    save_file({"s0": -s0}, str(tmp_path / "other.safetensors"))
    assert _generated(capsys, monkeypatch, "--init-state", tmp_path / "other.safetensors", "--init-seed", "5") != given


def test_lens_reads_the_state_of_its_init_seed(capsys, monkeypatch):
    def probabilities(seed):
        code, stdout, err = invoke(capsys, monkeypatch, "lens", "tiny-raven", "--prompt", PROMPT, "--loops", "3",
                                   "--json", "--init-seed", seed)
        assert code == 0, err
        return [row["prob"] for row in json.loads(stdout)["rows"] if "prob" in row]

    assert probabilities("3") == probabilities("3") != probabilities("4")


def _state_file(tmp_path: Path, tensors: dict) -> Path:
    path = tmp_path / "s0.safetensors"
    save_file(tensors, str(path))
    return path


def _text_file(path: Path) -> Path:
    path.write_text("s0")
    return path


D = TINY_NATIVE["tiny-raven"]["n_embd"]
BAD_STATES = {
    "a directory": (lambda tmp: tmp, "is not a file"),
    "not safetensors": (lambda tmp: _text_file(tmp / "s0.safetensors"), "is not a readable safetensors file"),
    "two tensors": (lambda tmp: _state_file(tmp, {"a": torch.zeros(2, D), "b": torch.zeros(2, D)}),
                    "holds 2 tensors (a, b)"),
    "integers": (lambda tmp: _state_file(tmp, {"s0": torch.zeros(2, D, dtype=torch.int64)}), "is int64"),
    "1-D": (lambda tmp: _state_file(tmp, {"s0": torch.zeros(D)}), f"has shape ({D},)"),
    "not finite": (lambda tmp: _state_file(tmp, {"s0": torch.full((2, D), float("nan"))}), "not finite"),
    "wrong tokens": (lambda tmp: _state_file(tmp, {"s0": torch.zeros(1, 99, D)}), "init_state of prompt 1 has shape"),
    "wrong width": (lambda tmp: _state_file(tmp, {"s0": torch.zeros(1, 2, D + 1)}), f"{D + 1})"),
}


@pytest.mark.parametrize("bad", sorted(BAD_STATES))
def test_a_bad_init_state_file_is_one_line(capsys, monkeypatch, tmp_path, bad):
    make, fragment = BAD_STATES[bad]
    code, _, err = invoke(capsys, monkeypatch, "generate", "tiny-raven", "--prompt", PROMPT, "--init-state",
                          make(tmp_path), "--max-new-tokens", "2")
    assert_clean_error(code, err, fragment)


@pytest.mark.parametrize("command", ["generate", "lens"])
def test_a_family_without_an_initial_state_refuses_the_options(capsys, monkeypatch, tmp_path, command):
    code, _, err = invoke(capsys, monkeypatch, command, "tiny-ouro", "--prompt", PROMPT, "--init-seed", "1")
    assert_clean_error(code, err, "--init-seed: only a family whose loop starts from a state of its own (raven) takes",
                       "'tiny-ouro' has none")
    if command == "generate":
        path = _state_file(tmp_path, {"s0": torch.zeros(2, D)})
        code, _, err = invoke(capsys, monkeypatch, command, "tiny-ouro", "--prompt", PROMPT, "--init-state", path)
        assert_clean_error(code, err, "--init-state: only a family whose loop starts", "'tiny-ouro' has none")


@pytest.mark.slow   # two battery runs of the logit lens on tiny-raven
def test_probe_reads_raven_from_the_state_of_its_init_seed_and_records_it(capsys, monkeypatch, tmp_path):
    def lens_table(seed):
        out = tmp_path / f"seed{seed}"
        code, _, err = invoke(capsys, monkeypatch, "probe", "--checkpoint", "tiny-raven", "--out", out, "--only",
                              "logit_lens", "--init-seed", seed)
        assert code == 0, err
        assert json.loads((out / "summary.json").read_text())["model"]["init_seed"] == int(seed)
        return pd.read_parquet(out / "logit_lens.parquet")

    three = lens_table("3")
    assert not three["prob"].equals(lens_table("4")["prob"])


def test_probe_refuses_an_init_seed_for_a_family_without_an_initial_state(capsys, monkeypatch, tmp_path):
    out = tmp_path / "out"
    code, _, err = invoke(capsys, monkeypatch, "probe", "--checkpoint", "tiny-ouro", "--out", out, "--init-seed", "1")
    assert_clean_error(code, err, "--init-seed: only a family whose loop starts", "'tiny-ouro' has none")
    assert not out.exists()


def test_the_docs_and_the_help_name_the_registrys_families():
    """The table of docs/adding-a-looped-architecture.md is the registry, row for row; every command's help names
    each tiny model."""
    from workbench.commands.lens import MODEL_HELP

    page = (Path(__file__).parents[1] / "docs" / "adding-a-looped-architecture.md").read_text().splitlines()
    start = page.index("| family | config.json `model_type` | checkpoints | tiny model | initial state | its own exits "
                       "| reference numbers |")
    rows = {}
    for line in page[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells
    assert rows == {f.name: [f.name, f"`{f.model_type}`", f.checkpoints, f"`{f.tiny_name}`",
                             "s_0, seeded per position" if f.initial_state else "none", f.exits, f"`{f.fixture}`"]
                    for f in OWN_FAMILIES.values()}
    assert all(f.tiny_name in MODEL_HELP for f in OWN_FAMILIES.values())
