"""A generator, not a list (issue 29, item 6): hypothesis draws a command, an --out from each path family
and damaged inputs, and asserts the only outcomes a user can live with.

- Paths: new, unicode, empty, a user's file or directory, links (to a user's file, dangling), `..` and
  `.`, the command's input itself, inside it or above it, a repository root, a directory under a running
  training's lock, one another workbench process is writing (its guard lock held), a directory the
  workbench wrote (with and without --overwrite). Each command runs through the CLI up to its output guard
  (the work after it is cut off there: models are not loaded), and the guard's decision is checked
  against what the family allows.
- Values: every recipe key gets a value of a random type through --set; battery, recipe, claims,
  figure-spec, manifest, summary and parquet files get random bytes or random JSON/TOML values.

Always: exit 0 with the intended output (or the guard accepting), or exit 1/2 with one line, and every
file the user owned is unchanged (checksums before and after).
"""

import json
import os
import shutil
from pathlib import Path

import pytest
from filelock import FileLock
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.test_guard import checksums
from workbench import cli, guard
from workbench.errors import WorkbenchError
from workbench.guard import OUTPUT_MARKER
from workbench.io import locked_dir
from workbench.train.recipe import parse_override

ROOT = Path(__file__).resolve().parents[1]
KEEPER = ROOT / "training" / "keepers" / "smollm2-chase"
SUMMARY = ROOT / "training" / "keepers" / "smollm2-chase-anneal" / "battery" / "summary.json"
FUZZ = settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)

PATHS = ("new", "unicode", "empty dir", "user dir", "user file", "link to user dir", "link to user file",
         "dangling link", "dotdot", "dot", "input itself", "inside input", "holds input", "repository root",
         "training lock", "guard held", "marked dir")
KIND = {"demo": "dir", "select-block": "dir", "probe": "dir", "train": "run", "report": "file", "rows": "file",
        "compare": "files", "claims": "files", "figures": "files"}
ALWAYS_REFUSED = {"user file", "link to user dir", "link to user file", "dangling link", "dotdot", "dot",
                  "input itself", "repository root", "training lock", "guard held"}


REAL_INIT = guard.Guard.__init__


class Accepted(Exception):
    """The guard let the command through: the work after it is cut off here."""


def _sandbox(root: Path) -> dict:
    """The inputs of every command, inside `root`, and a user's own files beside them."""
    res = root / "res"
    res.mkdir()
    shutil.copy(SUMMARY, res / "summary.json")
    run = root / "run"
    run.mkdir()
    for name in ("retrofit.json", "provenance.json", "recipe.toml", "trainable.safetensors"):
        shutil.copy(KEEPER / name, run / name)
    shutil.copy(ROOT / "training" / "smollm2_lora_chase.toml", root / "recipe.toml")
    shutil.copy(ROOT / "workbench" / "data" / "claims.toml", root / "claims.toml")
    (root / "corpus.txt").write_text("one text\nanother text\n")
    (root / "mine").mkdir()
    (root / "mine" / "thesis.tex").write_text("a user's work")
    (root / "notes.md").write_text("a user's notes")
    return {"res": res, "run": run, "recipe": root / "recipe.toml", "claims": root / "claims.toml",
            "corpus": root / "corpus.txt"}


def _input_of(command: str, inputs: dict) -> Path:
    return {"probe": inputs["run"], "train": inputs["recipe"], "report": inputs["res"] / "summary.json",
            "compare": inputs["res"] / "summary.json", "figures": inputs["res"] / "summary.json",
            "claims": inputs["claims"], "select-block": inputs["corpus"], "demo": KEEPER}.get(command, inputs["res"])


def _out(root: Path, family: str, command: str, inputs: dict) -> Path:
    suffix = {"report": ".html", "rows": ".jsonl"}.get(command, "")
    if family == "new":
        return root / f"out{suffix}"
    if family == "unicode":
        return root / f"résumé ✓ 出力{suffix}"
    if family == "empty dir":
        (root / "empty").mkdir()
        return root / "empty"
    if family == "user dir":
        return root / "mine"
    if family == "user file":
        target = root / f"notes{suffix or '.md'}"
        if not target.exists():
            target.write_text("a user's file")
        return target
    if family == "link to user dir":
        (root / "link").symlink_to(root / "mine")
        return root / "link"
    if family == "link to user file":
        (root / f"link{suffix}").symlink_to(root / "notes.md")
        return root / f"link{suffix}"
    if family == "dangling link":
        (root / f"dangling{suffix}").symlink_to(root / "nowhere")
        return root / f"dangling{suffix}"
    if family == "dotdot":
        return root / "mine" / ".."
    if family == "dot":
        return Path(".")
    if family == "input itself":
        return _input_of(command, inputs)
    if family == "inside input":
        return _input_of(command, inputs) / f"sub{suffix}"
    if family == "holds input":
        return _input_of(command, inputs).parent
    if family == "repository root":
        (root / "repo" / ".git").mkdir(parents=True)
        return root / "repo"
    if family in ("training lock", "guard held"):
        (root / "busy").mkdir()
        return root / f"busy{suffix}" if family == "guard held" else root / "busy"
    if family == "marked dir":
        (root / "marked").mkdir()
        (root / "marked" / OUTPUT_MARKER).write_text('{"written_by": "workbench probe"}')
        (root / "marked" / "depth_matrix.parquet").write_bytes(b"old results")
        return root / "marked"
    raise AssertionError(family)


def _args(command: str, out: Path, inputs: dict, overwrite: bool) -> list[str]:
    args = {
        "demo": ["demo"], "select-block": ["select-block", "--model", "tiny-llama", "--corpus", inputs["corpus"]],
        "train": ["train", inputs["recipe"]],
        "probe": ["probe", "--checkpoint", inputs["run"], "--battery", "demo"],
        "compare": ["compare", inputs["res"], inputs["res"]], "report": ["report", inputs["res"]],
        "figures": ["figures", "--results", inputs["res"], "--format", "html"],
        "claims": ["claims", "--claims", inputs["claims"]],
        "rows": ["rows", "--task", "state", "--depths", "1-2", "--per-depth", "2", "--seed", "1"],
    }[command] + ["--out", out]
    if overwrite and command in ("demo", "select-block", "probe", "rows"):
        args.append("--overwrite")
    return [str(a) for a in args]


def _run(args: list[str]) -> tuple[str, str]:
    """('accepted' | 'refused' | 'done', message) of one in-process CLI call; anything else fails the test."""
    try:
        cli.app(args, standalone_mode=False)
    except Accepted:
        return "accepted", ""
    except WorkbenchError as err:
        assert str(err) and "\n" not in str(err), str(err)
        return "refused", str(err)
    return "done", ""


@pytest.mark.slow   # 300 generated cases (12.6 s quiet); tests/test_guard.py keeps every command's guard fast
@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)  # ~all 306
@given(command=st.sampled_from(sorted(KIND)), family=st.sampled_from(PATHS), overwrite=st.booleans())
def test_every_command_on_every_path_family(tmp_path_factory, monkeypatch, command, family, overwrite):
    root = tmp_path_factory.mktemp("fam")
    inputs = _sandbox(root)
    out = _out(root, family, command, inputs)
    monkeypatch.chdir(root)
    real = REAL_INIT  # not guard.Guard.__init__: a previous example's patch is still in place

    def stop_at_the_guard(self, *a, **k):
        real(self, *a, **k)
        raise Accepted(self.command)

    monkeypatch.setattr(guard.Guard, "__init__", stop_at_the_guard)
    holders = []
    if family == "training lock":
        holders.append(locked_dir(out, "run directory"))
        holders[-1].__enter__()
    if family == "guard held":  # another process's guard: filelock's lock on the same file through another open file
        guard.lock_dir().mkdir(parents=True, exist_ok=True)
        holders.append(FileLock(guard.output_lock_file(out.resolve()), timeout=0))
        holders[-1].__enter__()
    before = checksums(root)
    try:
        outcome, message = _run(_args(command, out, inputs, overwrite))
        after = checksums(root)
    finally:
        for h in holders:
            h.__exit__(None, None, None)
    assert outcome in ("accepted", "refused"), (command, family, outcome)  # nothing got past the guard
    assert after == before, (command, family, outcome, message)
    kind = KIND[command]
    if family in ALWAYS_REFUSED or (family in ("user dir", "holds input") and kind in ("dir", "run", "file")):
        assert outcome == "refused", (command, family)
    if family in ("new", "unicode") or (family == "empty dir" and kind != "file"):
        assert outcome == "accepted", (command, family, message)
    if family == "marked dir" and kind == "dir":
        assert outcome == ("accepted" if overwrite else "refused"), (command, family, overwrite, message)
    if family == "marked dir" and kind == "run":
        assert outcome == "refused", message


# ----------------------------------------------------------------------------- damaged inputs and wrong values
json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                       max_size=3), max_leaves=6)
toml_scalars = st.one_of(st.integers(), st.floats(allow_nan=False), st.booleans(), st.text(max_size=5).map(json.dumps),
                         st.lists(st.integers() | st.text(max_size=3).map(json.dumps), max_size=3).map(
                             lambda v: "[" + ", ".join(map(str, v)) + "]"))


def _known_keys():
    from workbench.train.recipe import known_keys

    return [k.replace("stages.N.", "stages.0.") for k in known_keys()]


def _train_with(root: Path, monkeypatch, item: str) -> tuple[str, str]:
    """The outcome of `workbench train RECIPE --set item` in the sandbox under `root`, stopped at the guard."""
    inputs = _sandbox(root)
    real = REAL_INIT  # not guard.Guard.__init__: a previous example's patch is still in place

    def stop_at_the_guard(self, *a, **k):
        real(self, *a, **k)
        raise Accepted(self.command)

    monkeypatch.setattr(guard.Guard, "__init__", stop_at_the_guard)
    before = checksums(root)
    outcome, message = _run(["train", str(inputs["recipe"]), "--out", str(root / "new"), "--set", item])
    assert checksums(root) == before, (item, outcome, message)  # refused or accepted, nothing written before the guard
    return outcome, message


def _declared(key: str, value) -> bool:
    """Whether `value` is one the recipe key's own declaration (its annotation in the schema) accepts."""
    from pydantic import TypeAdapter, ValidationError

    from tests.training.test_recipe_bounds import _hint

    try:
        TypeAdapter(_hint(key)).validate_python(value)
    except ValidationError:
        return False
    return True


@pytest.mark.slow   # 80 generated recipes (5.2 s quiet); tests/test_cli_errors.py keeps a bad recipe key fast
@FUZZ
@given(key=st.sampled_from(_known_keys()), value=toml_scalars)
def test_a_value_its_key_declares_wrong_is_refused_in_one_line_before_any_file(tmp_path_factory, monkeypatch, key,
                                                                                value):
    outcome, message = _train_with(tmp_path_factory.mktemp("set"), monkeypatch, f"{key}={value}")
    assert outcome in ("accepted", "refused"), (key, value)  # the guard is reached or the recipe refused, one line
    if not _declared(key, parse_override(f"{key}={value}")[1]):  # what its declaration refuses never reaches the guard
        assert outcome == "refused" and key in message, (key, value, outcome, message)


@pytest.mark.parametrize("item", [
    "optim.lr=-1.0", "sampler.mean=0.5", "halting.lr=0.0", "halting.objective='nonsense'", "train.precision='fp8'",
    "guardrail.every=-1", "stages.0.steps=true", "model.max_loops='four'", "halting.act_cost=-5.0",
    "halting.margin=-1e9", "sampler.max=-3", "task.surface='nonsense'"])
def test_an_out_of_range_recipe_value_is_refused_in_one_line_before_any_file(tmp_path, monkeypatch, item):
    outcome, message = _train_with(tmp_path, monkeypatch, item)
    assert outcome == "refused" and item.split("=")[0] in message, (outcome, message)


DAMAGE = st.one_of(st.binary(max_size=80), json_values.map(lambda v: json.dumps(v).encode()),
                   st.text(max_size=60).map(str.encode))


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(target=st.sampled_from(["summary", "claims.json", "parquet", "claims toml", "spec", "battery", "recipe",
                               "manifest", "manifest sidecar"]),
       data=DAMAGE)
def test_damaged_files_every_command_reads(tmp_path_factory, monkeypatch, target, data):
    root = tmp_path_factory.mktemp("dmg")
    inputs = _sandbox(root)
    real = REAL_INIT  # not guard.Guard.__init__: a previous example's patch is still in place

    def stop_expensive(self, *a, **k):
        real(self, *a, **k)
        if self.command in ("probe", "train"):
            raise Accepted(self.command)  # a model load follows: inputs are validated by then

    monkeypatch.setattr(guard.Guard, "__init__", stop_expensive)
    res, out = inputs["res"], root / "out"
    if target == "summary":
        (res / "summary.json").write_bytes(data)
        runs = [["report", res, "--out", out / "r.html"]]
    elif target == "claims.json":
        (res / "claims.json").write_bytes(data)
        runs = [["report", res, "--out", out / "r.html"]]
    elif target == "parquet":
        (res / "depth_matrix.parquet").write_bytes(data)
        runs = [["report", res, "--out", out / "r.html"], ["compare", res, res, "--out", out],
                ["figures", "--results", res, "--format", "html", "--out", out]]
    elif target == "claims toml":
        inputs["claims"].write_bytes(data)
        runs = [["claims", "--claims", inputs["claims"], "--out", out]]
    elif target == "spec":
        (root / "spec.toml").write_bytes(data)
        runs = [["figures", "--results", res, "--format", "html", "--spec", root / "spec.toml", "--out", out]]
    elif target == "battery":
        (root / "battery.toml").write_bytes(data)
        runs = [["probe", "--checkpoint", inputs["run"], "--battery", root / "battery.toml", "--out", out]]
    elif target == "recipe":
        inputs["recipe"].write_bytes(data)
        runs = [["train", inputs["recipe"], "--out", out]]
    else:
        from workbench.tasks.manifest import sidecar_path

        rows = root / "rows.jsonl"
        shutil.copy(ROOT / "probes" / "chase_n8_d1-7.jsonl", rows)
        shutil.copy(sidecar_path(ROOT / "probes" / "chase_n8_d1-7.jsonl"), sidecar_path(rows))
        (rows if target == "manifest" else sidecar_path(rows)).write_bytes(data)
        runs = [["probe", "--checkpoint", inputs["run"], "--rows", rows, "--out", out]]
    before = checksums(root)
    for args in runs:
        outcome, message = _run([str(a) for a in args])
        after = checksums(root)
        if outcome == "refused":
            assert after == before, (args, message)
        else:  # done (or accepted at the guard): only the intended output is new, nothing else changed
            assert {k: v for k, v in after.items() if not k.startswith("out")} == before, args
        shutil.rmtree(out, ignore_errors=True)


FEW = settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
PATHLIKE = st.one_of(st.sampled_from(["../x", "/tmp/x", "a/../../x", "~/x", "..", ".", "a/b", "ok", "", " "]),
                     st.text(alphabet="./~ab", min_size=1, max_size=8))


@FEW
@given(name=PATHLIKE)
def test_a_path_taken_from_a_recipe_never_leaves_runs(tmp_path_factory, monkeypatch, name):
    root = tmp_path_factory.mktemp("name")
    inputs = _sandbox(root)
    monkeypatch.chdir(root)
    seen = []
    real = REAL_INIT  # not guard.Guard.__init__: a previous example's patch is still in place

    def stop_at_the_guard(self, *a, **k):
        real(self, *a, **k)
        seen.append(self.target)
        raise Accepted(self.command)

    monkeypatch.setattr(guard.Guard, "__init__", stop_at_the_guard)
    before = checksums(root)
    outcome, _ = _run(["train", str(inputs["recipe"]), "--set", f"name={json.dumps(name)}"])
    assert outcome in ("accepted", "refused")
    if outcome == "accepted":
        assert (root / "runs").resolve() in seen[0].parents, (name, seen)
    assert checksums(root) == before


@FEW
@given(stem=PATHLIKE)
def test_a_figure_file_name_from_a_spec_never_leaves_out(tmp_path_factory, monkeypatch, stem):
    root = tmp_path_factory.mktemp("spec")
    inputs = _sandbox(root)
    (root / "spec.toml").write_text(f'[[figure]]\nname = "depth_matrix"\nfile = {json.dumps(stem)}\n')
    seen = []
    real = REAL_INIT  # not guard.Guard.__init__: a previous example's patch is still in place

    def stop_at_the_guard(self, *a, **k):
        real(self, *a, **k)
        seen.append([self.target / n for n in self.names])
        raise Accepted(self.command)

    monkeypatch.setattr(guard.Guard, "__init__", stop_at_the_guard)
    before = checksums(root)
    out = root / "figs"
    outcome, _ = _run(["figures", "--results", str(inputs["res"]), "--format", "html", "--spec", str(root / "spec.toml"),
                       "--out", str(out)])
    assert outcome in ("accepted", "refused")
    if outcome == "accepted":
        assert all(out.resolve() in Path(os.path.normpath(p)).parents for p in seen[0]), (stem, seen)
    assert checksums(root) == before
