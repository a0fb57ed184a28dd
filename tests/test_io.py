"""Atomic files: one mechanism (workbench.io.atomic_path) for every writer."""

from __future__ import annotations

import pandas as pd
import pytest

from workbench.io import atomic_path, write_bytes_atomic


def test_atomic_path_replaces_the_file_only_when_the_write_finished(tmp_path):
    target = tmp_path / "sub" / "table.parquet"
    frame = pd.DataFrame({"x": [1, 2, 3]})
    with atomic_path(target) as tmp:
        assert tmp.parent == target.parent and tmp.name.startswith(".table.parquet.tmp")
        frame.to_parquet(tmp, index=False)
        assert not target.exists()  # nothing at the real name until the block ends
    pd.testing.assert_frame_equal(pd.read_parquet(target), frame)
    before = target.read_bytes()
    with pytest.raises(RuntimeError, match="killed"):
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"half a parq")
            raise RuntimeError("killed mid-write")
    assert target.read_bytes() == before  # the old file stands
    assert [p.name for p in target.parent.iterdir()] == ["table.parquet"]  # and no temporary is left


def test_write_bytes_atomic_goes_through_atomic_path(tmp_path):
    write_bytes_atomic(tmp_path / "a.bin", b"one")
    write_bytes_atomic(tmp_path / "a.bin", b"two")
    assert (tmp_path / "a.bin").read_bytes() == b"two" and len(list(tmp_path.iterdir())) == 1
