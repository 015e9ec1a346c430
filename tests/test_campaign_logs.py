"""measure.campaigns.logs: a round's per-job logs packed into one archive, read back loose or packed."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from calib.errors import CalibError
from measure.campaigns.logs import PACKED, main, pack, read_log
from tests.conftest import TRACES


def test_pack_keeps_every_log_and_reads_them_back(tmp_path: Path) -> None:
    rnd = tmp_path / "x1-round99"
    (rnd / "logs").mkdir(parents=True)
    (rnd / "logs" / "a.log").write_text("step 1\nCUDA out of memory\n")
    (rnd / "logs" / "b.log").write_text("done\n")
    assert read_log(rnd, "a") == "step 1\nCUDA out of memory\n"  # loose, as a round writes them
    n, size = pack(rnd)
    assert n == 2 and size == (rnd / PACKED).stat().st_size and not (rnd / "logs").exists()
    assert read_log(rnd, "a") == "step 1\nCUDA out of memory\n" and read_log(rnd, "b") == "done\n"
    assert read_log(rnd, "c") is None and read_log(tmp_path, "a") is None
    first = (rnd / PACKED).read_bytes()
    (rnd / "logs").mkdir()
    for name, text in (("a.log", "step 1\nCUDA out of memory\n"), ("b.log", "done\n")):
        (rnd / "logs" / name).write_text(text)
    pack(rnd)
    assert (rnd / PACKED).read_bytes() == first  # the archive depends only on the logs
    assert pack(rnd) == (0, 0)  # nothing loose: nothing to do


def test_a_corrupt_archive_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / PACKED).write_bytes(b"\xfd7zXZ\x00 not really")
    with pytest.raises(CalibError, match="not a readable log archive"):
        read_log(tmp_path, "a")


def test_committed_rounds_keep_their_logs_packed(capsys) -> None:
    rounds = sorted(p for p in TRACES.glob("*/_campaigns/*") if p.is_dir())
    assert rounds and not [r for r in rounds if (r / "logs").exists()]  # none loose: packed by main below
    packed = [r for r in rounds if (r / PACKED).is_file()]
    assert len(packed) >= 30
    for r in packed:
        with tarfile.open(r / PACKED, "r:xz") as tar:
            assert all(m.name.startswith("logs/") and m.name.endswith(".log") for m in tar.getmembers())
    assert main([str(rounds[0])]) == 0 and capsys.readouterr().out == ""
