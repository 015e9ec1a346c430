"""The measurement bundle: schema (dataclasses), atomic writer, reader and checks."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from calib.bundle.schema import (
    SCHEMA,
    GpuInfo,
    Manifest,
    RankMemory,
    RunSpec,
    Software,
    StepsInfo,
    TelemetryInfo,
)

if TYPE_CHECKING:
    from calib.bundle.io import Bundle, BundleWriter, bundle_sha256, check_bundle, load_bundles, read_bundle

# calib.bundle.io loads pandas and pyarrow, seconds on a cold disk; the schema loads neither. Importing
# calib.bundle.schema runs this package first, and the host-pace sampler's child process
# (measure/telemetry/host_pace.py) must start at once, so the reader and writer load on first use.
_IO_NAMES = ("Bundle", "BundleWriter", "bundle_sha256", "check_bundle", "load_bundles", "read_bundle")


def __getattr__(name: str) -> Any:
    if name in _IO_NAMES:
        from calib.bundle import io

        return getattr(io, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "SCHEMA", "Bundle", "BundleWriter", "GpuInfo", "Manifest", "RankMemory", "RunSpec", "Software",
    "StepsInfo", "TelemetryInfo", "bundle_sha256", "check_bundle", "load_bundles", "read_bundle",
]
