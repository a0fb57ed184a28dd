"""The claims ledger: each testable claim of the two papers against a committed specimen's numbers.

The claims and the papers' numbers live in `workbench/data/claims.toml` (data, not code). Each
names a `measure` (a function registered by `@measure`) that reads a specimen's committed battery results
(`<specimen>/battery/summary.json` and the parquet tables beside it), and a `test` that turns
the paper's number and ours into a verdict:

- reproduced: ours meets the paper's claim under the stated test;
- not reproduced: ours misses it (the comparison says by how much);
- not shown: the rows read cannot decide the rule (its interval could not exclude the margin even for a model at
  parity with the same discordance);
- not comparable: the specimen or its results are missing, or the setting cannot answer it (a *gate*
  failed: the loops read lie past the trained support, the Stage 1 model does not park, an arm has not
  installed a depth, the control never reaches its horizon, ...). Ours is still measured and shown, with
  what the rule alone would read, what would make the claim comparable and what that costs
  (`comparable_when`, `cost`: measured seconds per step from a committed run's provenance).

Every claim declares its `rule` (the verdict rule and its bar, in words) in the data file before the
specimen it reads is trained; the ledger prints it. The rules are built so that a trivial policy
cannot pass them: a halting head must also beat every constant-depth policy at its own mean loops,
the installation bar holds at every depth, overshoot counts the cells where the chain's cycle makes the
iterate and park symbols coincide apart, a stateful claim is gated on the best rule with no model.

The ledger is a pure function of committed files, so `workbench claims` regenerates it byte
for byte (a test checks `claims/LEDGER.md`).

In parts: `ledger` (the machinery: the claims file, the registries `MEASURES` and `TESTS` with their decorators,
the result readers, the ledger built and written), `rules` (the verdict tests no paper owns), `retrofit` (paper
000's measures and tests), `arms_rows` (its arms compared: final answers and latency, with the majority-answer
null), `recurtrace` (paper 002's), `selection_rows` (both papers' block-selection rows) and `halting_checks` (the
constant-depth envelope and a Stage 2 head's training record, which the halting rows lean on) and `nulls` (one null
generator per rule kind, and `admit`, which every null passes). Importing the package imports every part, which
fills the registries. Every measure returns its nulls beside its reading (a policy that knows nothing, through the
same test and gates: `ledger.run_nulls`).
"""

from workbench.analysis.claims import (  # noqa: F401  (they fill the registries)
    arms_rows,
    ledger,
    recurtrace,
    retrofit,
    rules,
    selection_rows,
)
from workbench.analysis.claims.halting_checks import constant_envelope
from workbench.analysis.claims.ledger import (
    CLAIMS_FILE,
    LEDGER_FILES,
    MEASURES,
    ROOT,
    TESTS,
    VERDICTS,
    build_ledger,
    counts_table,
    ledger_html,
    ledger_markdown,
    load_claims,
    write_ledger,
)
from workbench.analysis.claims.recurtrace import no_model_rule
from workbench.analysis.claims.selection_rows import recorded_recipe

__all__ = ["CLAIMS_FILE", "LEDGER_FILES", "MEASURES", "ROOT", "TESTS", "VERDICTS", "build_ledger", "constant_envelope",
           "counts_table", "ledger_html", "ledger_markdown", "load_claims", "no_model_rule", "recorded_recipe",
           "write_ledger"]
