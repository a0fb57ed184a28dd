"""Analysis: what the probes' tables and summaries say, read without a model.

- `stats`: exact paired tests (one paired-counts function), Fisher gates, Wilson, Newcombe and bootstrap
  intervals, the validity frontier.
- `headlines`: each probe's few named numbers with n and a 95% interval (one module per probe, found by its name,
  reading its tables), the headline table, and comparing two specimens'.
- `results`: reading a results directory (its tables, its summary, the depth matrices of two, paired).
- `readings`: how to read a battery's numbers (chance, whether it is a demo).
- `arms`: paired comparisons between trained arms on the same frozen rows.
- `claims`: the claims ledger, each paper claim against a committed specimen's numbers (a package: `ledger`,
  `rules`, and one module per paper, `retrofit` and `recurtrace`).

Nothing here imports the probes, the plots, the report or the commands: analysis reads what the
probes wrote (tables, summary.json), or what a caller passes in (`tests/test_imports.py`).
"""
