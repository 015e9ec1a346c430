"""A campaign round's per-job logs: committed packed as `<round>/logs.tar.xz` (one file instead of one per job:
the tree travels with every device call under a 64 MiB limit, and each small file costs a tar header and a
block), or, as a round writes them, loose in `<round>/logs/`.

    python -m measure.campaigns.logs ROUND_DIR [...]   # pack a round's logs/ into logs.tar.xz, checked
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import tarfile
from pathlib import Path

from calib.errors import CalibError

PACKED = "logs.tar.xz"


def read_log(campaign: Path, run: str) -> str | None:
    """The log of job `run` in the campaign round folder `campaign` (loose or packed); None: none kept."""
    loose = campaign / "logs" / f"{run}.log"
    if loose.is_file():
        return loose.read_text(errors="replace")
    packed = campaign / PACKED
    if not packed.is_file():
        return None
    try:
        with tarfile.open(packed, "r:xz") as tar:
            member = tar.extractfile(f"logs/{run}.log")
            return None if member is None else member.read().decode(errors="replace")
    except KeyError:
        return None
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise CalibError(f"{packed}: not a readable log archive ({exc})") from None


def pack(campaign: Path) -> tuple[int, int]:
    """Pack `campaign`/logs/ into `campaign`/logs.tar.xz (members sorted, owner and times cleared, so the
    archive depends only on the logs), check every log reads back the same, then remove logs/. Returns (files,
    archive bytes); (0, 0) where there is no logs/."""
    loose = campaign / "logs"
    if not loose.is_dir():
        return 0, 0
    logs = {p.name: p.read_bytes() for p in sorted(loose.iterdir()) if p.is_file()}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in logs.items():
            info = tarfile.TarInfo(f"logs/{name}")
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    tmp = campaign / (PACKED + ".tmp")
    tmp.write_bytes(buf.getvalue())
    with tarfile.open(tmp, "r:xz") as tar:
        for name, data in logs.items():
            member = tar.extractfile(f"logs/{name}")
            if member is None or member.read() != data:
                tmp.unlink()
                raise CalibError(f"{campaign}: {name} does not read back the same from the archive; left as it was")
    os.replace(tmp, campaign / PACKED)
    shutil.rmtree(loose)
    return len(logs), (campaign / PACKED).stat().st_size


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rounds", nargs="+")
    for r in ap.parse_args(argv).rounds:
        try:
            n, size = pack(Path(r))
        except CalibError as exc:
            raise SystemExit(f"logs: {exc}") from None
        if n:
            print(f"{r}: {n} logs -> {PACKED} ({size / 1e3:.1f} kB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
