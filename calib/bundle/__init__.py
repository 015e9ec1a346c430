"""The measurement bundle: schema (dataclasses), atomic writer, reader and checks."""

from calib.bundle.io import Bundle, BundleWriter, bundle_sha256, check_bundle, load_bundles, read_bundle
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

__all__ = [
    "SCHEMA", "Bundle", "BundleWriter", "GpuInfo", "Manifest", "RankMemory", "RunSpec", "Software",
    "StepsInfo", "TelemetryInfo", "bundle_sha256", "check_bundle", "load_bundles", "read_bundle",
]
