"""The working tree travels whole with every device call, under 64 MiB with the carried megatron-core package
(docs/measure.md): committed bundles must leave room for it and for the next round's."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile

import pytest

from tests.conftest import ROOT

LIMIT = 64 * 2**20
# The megatron-core 0.19.2 wheel travels beside the tree as its files in one xz tar (.whl/*.site.tar.xz, measure/
# carry.sh: 1,487,312 bytes, 1.42 MiB; the wheel itself was 2.26 MiB, carried until the thirty-seventh session).
# Its room is that file as tar counts it plus 64 KiB for a repacking's different metadata (until the fifty-eighth
# session a flat 1.6 MiB, 0.18 MiB over the file, which the tree's growth had used up).
WHEEL_BYTES = 1_487_312
WHEEL_ROOM = 512 + (WHEEL_BYTES + 511) // 512 * 512 + 64 * 2**10


def travelling_files() -> list[str]:
    """What a device call copies: tracked files and untracked files git does not ignore."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, check=True).stdout.decode()
    return sorted({p for p in out.split("\0") if p and (ROOT / p).is_file()})


def tar_bytes(files: list[str]) -> int:
    """The size of an uncompressed tar of `files` (512-byte headers and blocks), as the limit counts it."""
    total = 0
    for f in files:
        size = (ROOT / f).stat().st_size
        total += 512 + (size + 511) // 512 * 512
    return total + 1024


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout")
def test_the_tree_that_travels_leaves_room_for_the_wheel() -> None:
    size = tar_bytes(travelling_files())
    assert size + WHEEL_ROOM < LIMIT, f"{size / 2**20:.1f} MiB of tree + the wheel would not travel"
    for carried in (ROOT / ".whl").glob("*.site.tar.xz"):  # where this checkout packed it: the room holds it
        assert carried.stat().st_size <= WHEEL_BYTES + 64 * 2**10, f"{carried.name} outgrew WHEEL_BYTES"


def test_tar_bytes_counts_as_tar_does(tmp_path) -> None:
    files = ["pyproject.toml", "README.md"]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for f in files:
            tar.add(ROOT / f, arcname=f)
    # tarfile pads the archive to its record size (10 KiB); the count is within one record of it.
    assert 0 <= len(buf.getvalue()) - tar_bytes(files) < tarfile.RECORDSIZE
