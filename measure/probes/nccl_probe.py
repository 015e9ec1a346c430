"""What the plain-torch NCCL probes share: their command line and their one JSON (measure/probes/nccl_call.sh)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def save(out_dir: Path, name: str, torch: Any, device: Any, **fields: Any) -> None:
    """DIR/<name>.json: the GPU, torch and NCCL versions, then the probe's own fields."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps({
        "device": torch.cuda.get_device_name(device), "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())), **fields}))


def finish(out_dir: Path, name: str, torch: Any, dist: Any, device: Any, **fields: Any) -> None:
    """Rank 0 saves the probe's JSON (`save`); every rank then leaves the process group."""
    if dist.get_rank() == 0:
        save(out_dir, name, torch, device, **fields)
    dist.destroy_process_group()


def probe_main(run: Callable[[Path], None], doc: str, argv: list[str] | None = None) -> int:
    """`--out DIR`, then run(DIR) on this rank (under torchrun)."""
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    run(p.parse_args(argv).out)
    return 0
