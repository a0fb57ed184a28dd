"""Task generators, frozen row manifests, the reader and the capability guardrail.

A row is a JSON-serialisable dict. Every task writes:

    row_id            unique, readable: "chase-letters16-symbolic-test-s20260702-d03-0007"
    task              "chase" | "phop" | "state" | "state_query" | "arith" | "guardrail"
    template_version  the prompt template's version ("chase-v1", "recurtrace-v1", "arith-v1")
    split, seed, index, alphabet   seed material (with task and depth; see `seeding`)
    depth             d, the number of steps
    prompt            the text, ending with "Answer:"
    start             x0
    chain             [x_1, .., x_d]: the state after each step
    answer            chain[-1]; the model reads " " + answer
    symbols           the candidate symbols the reader scores (empty for arith)

plus, per task: `table` (K -> V) and `symbol_set`, `surface`, `permutation` for the chase;
`table` for p-hop; `registers`, `steps` for state tracking (and `query`, `answer_prefix` for
state_query, whose prompt ends with "Answer: "); `steps` for arithmetic.

Rows of a user's own (`workbench rows --from FILE.jsonl`, or a generator function named as
`module:function`) are checked and made into the same rows, task "user", by `workbench.tasks.user`:
their depth is 0 where not given, and they carry only the fields given.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from workbench.defaults import TASK_NAMES
from workbench.errors import WorkbenchError
from workbench.tasks.chase import chase_rows
from workbench.tasks.recurtrace import recurtrace_rows
from workbench.tasks.user import task_rows

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

TASKS = TASK_NAMES
DEFAULT_ALPHABET = {"chase": 16, "phop": 32}


def build_rows(task: str, depths: Iterable[int], per_depth: int, seed: int, *, alphabet: int | None = None,
               tokenizer: PreTrainedTokenizerBase | None = None, surface: str = "symbolic", symbol_set: str | None = None,
               permutation: bool = False, split: str = "test", first_index: int = 0) -> list[dict]:
    """Returns the rows of one task family, depth-major; options a task does not use must be left default.

    `alphabet` defaults to 16 for the chase and 32 for p-hop; state and arith take none. Row
    indices run from `first_index` at each depth. A `task` "module:function" is a user's generator
    (`workbench.tasks.user.task_rows`: called with those of seed, depths, per_depth it takes, its rows
    checked against `tokenizer`, which it needs); it takes none of the other options.

    Raises:
        WorkbenchError: an unknown task, an option the task does not take, or a bad value.
    """
    if ":" in task:
        if (alphabet, surface, symbol_set, permutation, split, first_index) != (None, "symbolic", None, False, "test", 0):
            raise WorkbenchError(f"task '{task}' is a generator function; it takes no alphabet, surface, symbol set, "
                                 "permutation, split or first index")
        return task_rows(task, tokenizer, seed=seed, depths=list(depths), per_depth=per_depth, strict=False).rows
    if task not in TASKS:
        raise WorkbenchError(f"task '{task}' is unknown; accepted: {', '.join(TASKS)}, or module:function "
                             "(a generator of rows, workbench.tasks.user)")
    alphabet = DEFAULT_ALPHABET.get(task) if alphabet is None else alphabet
    if task == "chase":
        return chase_rows(alphabet, depths, per_depth, seed, tokenizer=tokenizer, surface=surface,
                          symbol_set=symbol_set, permutation=permutation, split=split, first_index=first_index)
    if surface != "symbolic" or symbol_set is not None or permutation or (alphabet is not None and task != "phop"):
        raise WorkbenchError(f"task '{task}' takes no surface, symbol set or permutation option"
                             + ("" if task == "phop" else ", nor an alphabet"))
    options = {"split": split, "first_index": first_index}
    if task == "phop":
        options.update(tokenizer=tokenizer, alphabet=alphabet)
    return recurtrace_rows(task, depths, per_depth, seed, **options)


def task_row(task: str, depth: int, index: int, seed: int, *, split: str, tokenizer=None, alphabet: int | None = None,
             surface: str = "symbolic", symbol_set: str | None = None, permutation: bool = False) -> dict:
    """Returns one row of any task (the trainer's fresh rows); options as for `build_rows`."""
    return build_rows(task, [depth], 1, seed, alphabet=alphabet, tokenizer=tokenizer, surface=surface,
                      symbol_set=symbol_set, permutation=permutation, split=split, first_index=index)[0]
