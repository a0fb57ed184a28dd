"""Every probe's needs are asked before any work: each declared field, `Need` and capability, broken one at a time
on rows and a model that meet all the others, makes the probe not applicable with no forward (generated over the
probe registry). The battery asks every probe before the first runs, and refuses a row past the model's positions
anywhere in a manifest before any probe."""

from __future__ import annotations

import pytest

from workbench.errors import WorkbenchError
from workbench.models.looped import CAPABILITIES
from workbench.probes import PROBES, NotApplicable, battery, get_probe
from workbench.probes.battery import run_battery, run_probe
from workbench.probes.common import FUNCTION_TABLE, HALTING_HEAD, ONE_TOKEN
from workbench.probes.pairs import CORRUPT_TWIN
from workbench.tasks import build_rows
from workbench.tasks.manifest import write_manifest
from workbench.tasks.user import check_user_rows

UNTRAINED = "untrained:tiny-llama:2:4"


class Unread:
    """A model that meets every need (`supports` every capability, a halting head) and counts every forward; any
    other attribute a probe reaches for is recorded, as work begun."""

    def __init__(self, supports=tuple(CAPABILITIES), halting: object | None = "a head"):
        self.supports, self.halting = frozenset(supports), halting
        self.unsupported = {c: f"the stand-in lacks {c}" for c in CAPABILITIES}
        self.forwards, self.touched = 0, []

    def __getattr__(self, name):
        self.__dict__.setdefault("touched", []).append(name)
        raise AttributeError(name)

    def _forward(self, *args, **kwargs):
        self.forwards += 1
        raise AssertionError("a forward ran")

    read = adaptive_read = forward = __call__ = generate = _forward


def without(rows, field):
    return [{k: v for k, v in r.items() if k != field} for r in rows]


# How each `Need` is broken on rows and a model that meet every other one (a new Need without a way to break it
# fails the generated test by name).
BREAK = {
    ONE_TOKEN: lambda rows, model: ([{**r, "symbols": []} for r in rows], model),          # answers read exactly
    FUNCTION_TABLE: lambda rows, model: ([{**r, "task": "user"} for r in rows], model),
    CORRUPT_TWIN: lambda rows, model: ([{**r, "task": "user"} for r in rows], model),
    HALTING_HEAD: lambda rows, model: (rows, Unread(halting=None)),
}


def broken_needs():
    for name in PROBES:
        spec = get_probe(name)
        yield from ((name, "field", f) for f in spec.fields)
        yield from ((name, "need", n.name) for n in spec.conditions)
        yield from ((name, "capability", c) for c in spec.requires)


@pytest.fixture(scope="module")
def good_rows(tok):
    """Chase rows: every field, one-token answers, tables, corruptible facts."""
    return build_rows("chase", [2, 3], 2, 5, alphabet=8, tokenizer=tok)


@pytest.mark.parametrize(("name", "kind", "what"), list(broken_needs()))
def test_each_declared_need_broken_makes_the_probe_not_applicable_before_any_forward(tok, good_rows, name, kind,
                                                                                      what):
    spec = get_probe(name)
    model, rows = Unread(), good_rows
    assert battery.unmet(spec, model, rows) is None                      # all met: the probe would run
    if kind == "field":
        rows, want = without(rows, what), f"needs {what}"
    elif kind == "capability":
        model = Unread(supports=set(CAPABILITIES) - {what})
        want = f"the stand-in lacks {what}"
    else:
        need = next(n for n in spec.conditions if n.name == what)
        rows, model = BREAK[need](rows, model)
        want = need.why(model, rows)
        assert want is not None and (want.startswith(f"needs {what}") or need is HALTING_HEAD), want
    assert battery.unmet(spec, model, rows) == want                   # what the battery asks before any probe
    with pytest.raises(NotApplicable) as caught:
        run_probe(name, model, tok, rows, {}, {})
    assert str(caught.value) == want
    assert model.forwards == 0 and model.touched == []


def test_latency_on_rows_read_exactly_needs_one_token_answers(tok):
    rows, _ = check_user_rows([(1, {"prompt": "The capital of France is", "answer": "Paris"}),
                               (2, {"prompt": "The largest city of the United States is", "answer": "New York"})],
                              tok, "test rows")
    reason = battery.unmet(get_probe("latency"), Unread(), rows)
    assert reason.startswith("needs one-token answers; row 'user-1' is read exactly")   # every row, one multi-token


@pytest.fixture(scope="module")
def free_rows(tmp_path_factory, tok):
    """Eight user rows read exactly (one a two-token answer), frozen as a manifest."""
    cities = [("France", "Paris"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Japan", "Tokyo"),
              ("Egypt", "Cairo"), ("Peru", "Lima"), ("Kenya", "Nairobi"), ("the United States", "Washington, D.C.")]
    rows, meta = check_user_rows([(i + 1, {"prompt": f"The capital of {c} is", "answer": a})
                                  for i, (c, a) in enumerate(cities)], tok, "test rows")
    path = tmp_path_factory.mktemp("rows") / "free.jsonl"
    write_manifest(rows, path, meta)
    return path, rows


def test_the_battery_asks_every_probe_before_the_first_runs(free_rows, tmp_path, monkeypatch):
    events = []
    ran = battery.run_probe
    monkeypatch.setattr(battery, "run_probe", lambda name, *a: events.append(("run", name)) or ran(name, *a))
    summary = run_battery(UNTRAINED, None, tmp_path / "out", rows=str(free_rows[0]), progress=False,
                          only=["loop_accuracy", "latency", "depth_matrix"],
                          announce=lambda skipped: events.append(("announce", skipped)))
    assert events[0] == ("announce", {"latency": summary["probes"]["latency"]["reason"],
                                      "depth_matrix": "needs chain, depth"})
    assert events[1:] == [("run", "loop_accuracy")]                     # the others never start
    assert summary["probes"]["latency"]["reason"].startswith("needs one-token answers")
    assert summary["probes"]["loop_accuracy"]["rows"] == 8 and (tmp_path / "out" / "loop_accuracy.parquet").is_file()


def test_a_row_past_the_models_positions_anywhere_in_a_manifest_is_refused_before_any_probe(
        free_rows, tmp_path, monkeypatch):
    rows = [dict(r) for r in free_rows[1]]
    rows[6]["prompt"] = "The capital of Peru is " * 260 + "The capital of Kenya is"   # row 7: about 1,300 tokens
    path = tmp_path / "long.jsonl"
    write_manifest(rows, path)
    monkeypatch.setattr(battery, "run_probe", lambda *a: pytest.fail("a probe ran"))
    with pytest.raises(WorkbenchError, match=rf"^manifest '{path}' row 'user-7' is \d+ tokens, longer than the "
                                             r"model's 1024-token context; shorten its prompt$"):
        run_battery(UNTRAINED, None, tmp_path / "out", rows=str(path), progress=False, only=["loop_accuracy"])
    assert not (tmp_path / "out").exists()


@pytest.mark.slow   # the report is drawn: about 8 s
def test_probe_prints_what_does_not_apply_first(free_rows, tmp_path):
    from typer.testing import CliRunner

    from workbench.cli import app

    result = CliRunner().invoke(app, ["probe", "--checkpoint", UNTRAINED, "--rows", str(free_rows[0]), "--only",
                                      "latency,loop_accuracy", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    first = result.stdout.splitlines()[0]
    assert first.startswith("not applicable: latency: needs one-token answers; row 'user-1' is read exactly"), first
