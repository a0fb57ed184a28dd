"""Function-table chase: instance invariants, surfaces, templates, token checks, seeding."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.errors import WorkbenchError
from workbench.tasks import chase
from workbench.tasks.chase import (
    LETTERS,
    NAMES,
    TEMPLATE_VERSION,
    chase_row,
    chase_rows,
    draw_instance,
    parse_prompt,
    render,
)
from workbench.tasks.seeding import row_rng

SEEDS = (20260702, 20260705)


def check_chase_row(row: dict) -> None:
    """Every invariant of the chase (docs/analyses.md) that one row must satisfy."""
    n, d, table = row["alphabet"], row["depth"], row["table"]
    orbit = [row["start"], *row["chain"]]
    assert 1 <= d < n
    assert len(row["chain"]) == d and row["answer"] == row["chain"][-1]
    assert len(set(orbit)) == d + 1, "orbit x0..xd must be distinct"
    assert all(table[orbit[i]] == orbit[i + 1] for i in range(d)), "f(x_i) = x_{i+1}"
    assert sorted(table) == sorted(row["symbols"]) and set(table.values()) <= set(row["symbols"])
    assert len(row["symbols"]) == n
    if row["permutation"]:
        assert sorted(table.values()) == sorted(table), "the control's f is a bijection"
    assert row["prompt"].endswith("\nAnswer:")
    assert row["template_version"] == TEMPLATE_VERSION
    surface, parsed = parse_prompt(row["prompt"])
    assert surface == row["surface"] and parsed.table == table and parsed.start == row["start"]
    assert parsed.depth == d and parsed.chain == row["chain"]


@settings(max_examples=400, deadline=None, database=None)
@given(
    n=st.sampled_from([8, 16, 24]),
    depth_frac=st.floats(0, 1, exclude_max=True),
    index=st.integers(0, 10_000),
    seed=st.integers(0, 2**40),
    surface=st.sampled_from(["symbolic", "relay", "pointer"]),
    permutation=st.booleans(),
)
def test_random_rows_satisfy_the_invariants(tok, n, depth_frac, index, seed, surface, permutation):
    depth = 1 + int(depth_frac * (n - 1))
    check_chase_row(chase_row(n, depth, index, seed, tokenizer=tok, surface=surface, permutation=permutation))


@pytest.mark.parametrize("n", [8, 16, 24])
def test_full_families_satisfy_the_invariants(tok, n):
    rows = chase_rows(n, range(1, n), 128, SEEDS[0], tokenizer=tok)
    assert len(rows) == (n - 1) * 128 and len({r["row_id"] for r in rows}) == len(rows)
    for row in rows:
        check_chase_row(row)


def test_permutation_control_is_bijective_and_many_to_one_default_is_not(tok):
    perm = chase_rows(16, range(1, 16), 32, 7, tokenizer=tok, permutation=True)
    default = chase_rows(16, range(1, 16), 32, 7, tokenizer=tok)
    for row in perm:
        check_chase_row(row)
    assert not any(len(set(r["table"].values())) == 16 for r in default[:50])


def test_verbal_and_symbolic_rows_of_one_instance_share_table_chain_answer(tok):
    by_surface = {
        s: chase_rows(16, range(1, 13), 128, SEEDS[0], tokenizer=tok, surface=s, symbol_set="names")
        for s in ("symbolic", "relay", "pointer")
    }
    for sym, relay, pointer in zip(*by_surface.values()):
        for verbal in (relay, pointer):
            for key in ("table", "depth", "start", "chain", "answer", "symbols"):
                assert verbal[key] == sym[key]
        assert len({sym["prompt"], relay["prompt"], pointer["prompt"]}) == 3
        assert len({sym["row_id"], relay["row_id"], pointer["row_id"]}) == 3
    letters = chase_rows(16, [5], 4, SEEDS[0], tokenizer=tok)
    rename = dict(zip(LETTERS, NAMES))
    assert [rename[x] for x in letters[0]["chain"]] == by_surface["symbolic"][4 * 128]["chain"]


def test_render_parse_round_trip_and_template_wording():
    inst = draw_instance(row_rng("chase", "test", 8, 1, 0, 1), list(NAMES[:8]), 1)
    for surface in ("symbolic", "relay", "pointer"):
        text = render(inst, surface)
        assert parse_prompt(text) == (surface, inst)
        assert text.splitlines()[0] == chase.TEMPLATES[surface]["header"]
        assert len(text.splitlines()) == 8 + 3
    assert "After 1 day," in render(inst, "relay") and "1 time." in render(inst, "symbolic")
    with pytest.raises(WorkbenchError, match="not a chase prompt"):
        parse_prompt("What is 2 + 2?\nAnswer:")


def test_table_lines_are_shuffled(tok):
    rows = chase_rows(16, [3], 20, 1, tokenizer=tok)
    orders = {tuple(line.split(" -> ")[0] for line in r["prompt"].splitlines()[1:17]) for r in rows}
    assert len(orders) == 20 and tuple(LETTERS[:16]) not in orders


def test_every_letter_and_name_is_one_smollm2_token(tok):
    for symbol in LETTERS + NAMES:
        assert len(tok.encode(" " + symbol, add_special_tokens=False)) == 1, symbol


def test_a_symbol_that_is_not_one_token_is_an_error_naming_it_and_the_tokenizer(tok, monkeypatch):
    monkeypatch.setitem(chase.SYMBOL_SETS, "names", ("Ben", "Max", "Zoe", "Kai"))
    with pytest.raises(WorkbenchError, match=r"'Zoe'.*smollm2-135m-instruct"):
        chase_row(4, 1, 0, 1, tokenizer=tok, symbol_set="names")


@pytest.mark.parametrize("n,depth", [(8, 0), (8, 8), (16, 16), (16, -1), (24, 30)])
def test_depth_outside_1_to_n_minus_1_is_an_error(tok, n, depth):
    with pytest.raises(WorkbenchError, match=f"depth {depth}"):
        chase_row(n, depth, 0, 1, tokenizer=tok)


@pytest.mark.parametrize("options,match", [
    ({"surface": "story"}, "surface 'story'"),
    ({"surface": "relay", "symbol_set": "letters"}, "needs name symbols"),
    ({"split": "eval"}, "split 'eval'"),
    ({"symbol_set": "greek"}, "symbol set 'greek'"),
])
def test_bad_options_are_errors(tok, options, match):
    with pytest.raises(WorkbenchError, match=match):
        chase_row(8, 2, 0, 1, tokenizer=tok, **options)


def test_alphabet_beyond_the_symbol_set_is_an_error(tok):
    with pytest.raises(WorkbenchError, match="alphabet 27"):
        chase_row(27, 2, 0, 1, tokenizer=tok)


def _instances(rows):
    return {(r["depth"], r["start"], tuple(sorted(r["table"].items()))) for r in rows}


@pytest.mark.parametrize("n", [8, 16, 24])
def test_neighbouring_seeds_share_no_instance(tok, n):
    a, b = (chase_rows(n, range(1, n), 128, s, tokenizer=tok) for s in SEEDS)
    assert not _instances(a) & _instances(b)
    assert len(_instances(a)) > 0.99 * len(a)


def test_hashed_seeds_differ_from_every_additive_offset():
    # seed + depth*10000 + row would make seed S row r+3 equal seed S+3 row r; hashing must not.
    streams = {s: [row_rng("chase", "test", 16, 4, i, s).random() for i in range(64)] for s in SEEDS}
    assert not set(streams[SEEDS[0]]) & set(streams[SEEDS[1]])


def test_generation_is_deterministic(tok):
    rows = chase_rows(16, [1, 7], 16, 3, tokenizer=tok)
    assert len(rows) == 32 and rows == chase_rows(16, [1, 7], 16, 3, tokenizer=tok)
    other = chase_rows(16, [1, 7], 16, 4, tokenizer=tok)  # another seed: other tables, so equality above means something
    assert sum(a["prompt"] != b["prompt"] for a, b in zip(rows, other)) == len(rows)
