"""The shipped stage kinds, one module each: its step function and its `StageKind` record (`workbench.train.kinds`).

Every module here is imported the first time the registry is read; a module of a contributor's own joins them by
calling `workbench.train.kinds.register` (tests/training/test_new_stage.py drops one in).
"""
