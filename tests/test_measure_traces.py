"""The committed real data (traces/): complete, consistent bundles that span what the issue asks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from calib.bundle.io import check_bundle, load_bundles
from calib.errors import CalibError
from calib.workload.models import resolve_model
from tests.conftest import TRACES


@pytest.fixture(scope="module")
def bundles() -> list:
    if not TRACES.is_dir():
        pytest.skip("no traces/ folder")
    return load_bundles([TRACES])


def test_every_bundle_is_complete_and_checks_clean(bundles: list) -> None:
    assert bundles
    for b in bundles:
        assert check_bundle(b) == [], b.id


def test_training_bundles_span_the_parallel_space(bundles: list) -> None:
    train = [b for b in bundles if b.manifest.kind == "training" and b.path.parent.name == "h200"]
    assert len(train) >= 16
    specs = [b.manifest.spec for b in train]
    assert any(s.tp > 1 for s in specs) and any(s.pp > 1 for s in specs)
    assert any(s.dp > 1 for s in specs) and any(s.ep > 1 for s in specs)
    assert {s.recompute for s in specs} >= {"none", "selective", "full"}
    assert {s.micro_batch for s in specs} >= {1, 2, 4}
    assert {s.tp * s.pp * s.dp for s in specs} >= {1, 2, 4}
    assert {resolve_model(s.model).name.split("-")[0] for s in specs} == {"gpt3", "llama3", "mixtral"}
    for b in train:
        world = b.manifest.spec.tp * b.manifest.spec.pp * b.manifest.spec.dp
        assert len(b.et_files()) == world, b.id
        groups = json.loads((b.path / "et" / "comm_groups.json").read_text())
        assert groups or world == 1, b.id  # one GPU: no communicator at all
        assert len(b.manifest.memory) == world and all(m.peak_allocated_bytes > 0 for m in b.manifest.memory)
        assert b.manifest.gpu.name == "NVIDIA H200"
        assert (b.path / "raw").exists() == (b.id in KEPT_RAW), b.id


def test_committed_ets_are_xz(bundles: list) -> None:
    """The tree travels with every device call under a size limit: committed ETs are kept in xz
    (measure.compact; about half of gzip's bytes)."""
    ets = [f for b in bundles for f in b.et_files()]
    assert len(ets) >= 300
    assert [f for f in ets if not f.name.endswith(".et.xz")] == []


def test_compact_recompresses_losslessly(tmp_path: Path) -> None:
    """measure.compact: each gzip ET and raw trace becomes an xz file that reads back to the same
    bytes, and no .gz is left beside it (two files of one rank would be refused)."""
    import gzip
    import lzma

    from calib.bundle.io import read_bundle
    from calib.chakra.codec import encode, read_et, write_et
    from measure.compact import compact

    src, copy = _with_raw(tmp_path)
    for f in [*copy.glob("et/rank.*.et.xz"), *copy.glob("raw/*.json.xz")]:
        plain = lzma.decompress(f.read_bytes())
        f.unlink()
        if f.name.endswith(".et.xz"):
            write_et(read_et_bytes(plain), f.with_suffix(".gz"))
        else:
            f.with_suffix(".gz").write_bytes(gzip.compress(plain))
    before = {f.name: gzip.decompress(f.read_bytes()) for f in copy.rglob("*.gz")}
    assert len(before) == 6
    size_gz, size_xz = compact(copy)
    assert 0 < size_xz < size_gz
    assert not list(copy.rglob("*.gz"))
    for name, data in before.items():
        xz = next(copy.rglob(name[: -len(".gz")] + ".xz"))
        assert lzma.decompress(xz.read_bytes()) == data, name
    bundle = read_bundle(copy)
    assert [encode(read_et(f)) for f in bundle.et_files()] == [encode(read_et(f)) for f in src.et_files()]


def test_compact_refuses_a_corrupt_gzip_in_one_line(tmp_path: Path) -> None:
    """A file named .gz that is not gzip (or is cut short): one clear error, and the file is left as it was."""
    import gzip

    from calib.errors import CalibError
    from measure.compact import compact

    (tmp_path / "et").mkdir()
    bad = tmp_path / "et" / "rank.0.et.gz"
    bad.write_bytes(gzip.compress(b"x" * 1000)[:20])
    with pytest.raises(CalibError, match="not a readable gzip file"):
        compact(tmp_path)
    assert bad.exists() and not (tmp_path / "et" / "rank.0.et.xz").exists()


def test_compact_rewrites_a_bundles_tables_as_bundles_are_written_now(tmp_path: Path) -> None:
    """measure.compact on tables written the earlier way (zstd at its default level): each reads back to
    the same frame, smaller, in the smallest of write_parquet's encodings; a table that is not parquet is one
    clear error and is left as it was."""
    import pandas as pd
    import pyarrow.parquet as pq

    from calib.bundle.io import PARQUET_ZSTD_LEVEL, _encodings
    from calib.errors import CalibError
    from measure.compact import compact, compact_parquet

    src = next(b for b in load_bundles([TRACES / "h200"]) if b.id == "llama8b-pp4-rcfull")
    copy = tmp_path / src.id
    shutil.copytree(src.path, copy)
    frames = {}
    for f in copy.glob("*.parquet"):
        frames[f.name] = pd.read_parquet(f)
        frames[f.name].to_parquet(f, index=False, compression="zstd")  # how bundles were written before
    before, after = compact(copy)
    assert 0 < after < 0.9 * before
    for name, frame in frames.items():
        again = pd.read_parquet(copy / name)
        pd.testing.assert_frame_equal(again, frame)
    for name in frames:  # each the smallest of the encodings write_parquet tries
        table = pq.read_table(copy / name)
        sizes = []
        for enc in _encodings(table):
            pq.write_table(table, tmp_path / "try.parquet", compression="zstd", compression_level=PARQUET_ZSTD_LEVEL,
                           **enc)
            sizes.append((tmp_path / "try.parquet").stat().st_size)
        assert (copy / name).stat().st_size == min(sizes), name
    assert compact(copy) == (after, after)  # compacted already: nothing changes
    bad = copy / "steps.parquet"
    bad.write_bytes(b"PAR1 not really")
    with pytest.raises(CalibError, match="not a readable parquet file"):
        compact_parquet(bad)
    assert bad.read_bytes() == b"PAR1 not really"


def test_write_parquet_takes_each_columns_own_encoding_where_that_is_smallest(tmp_path: Path) -> None:
    """A telemetry-like table (steady timestamps, a reading with four values, a counter): timestamps and counter
    split by byte stream, the reading by dictionary, in one file smaller than any encoding of the whole table."""
    import numpy as np
    import pandas as pd
    import pyarrow as pa

    from calib.bundle.io import _encoded, _encodings, _per_column, write_parquet

    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"t_s": np.cumsum(rng.uniform(0.019, 0.021, 5000)),
                          "power_w": rng.choice([300.5, 301.25, 450.0, 700.0], 5000),
                          "energy_j": np.cumsum(rng.uniform(5, 15, 5000))})
    table = pa.Table.from_pandas(frame, preserve_index=False)
    assert _per_column(table) == {"use_dictionary": ["power_w"], "use_byte_stream_split": ["t_s", "energy_j"]}
    write_parquet(frame, tmp_path / "t.parquet")
    whole_table = [len(_encoded(table, enc)) for enc in _encodings(table)[:-1]]
    assert (tmp_path / "t.parquet").stat().st_size < min(whole_table)
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "t.parquet"), frame)


def test_compact_rewrites_a_manifest_as_bundles_write_it_now(tmp_path: Path) -> None:
    """measure.compact on a manifest written indented, as bundles were until the forty-sixth session: the same object
    read back (a NaN field too), smaller, exactly as BundleWriter writes one now; compacted already, it is left as it
    is; one that is not JSON is one clear error and is left as it was."""
    from calib.bundle.io import manifest_text, read_bundle
    from measure.compact import compact_manifest

    src = TRACES / "h100" / "llama8b-pp4-rcfull"
    copy = tmp_path / src.name
    shutil.copytree(src, copy)
    mf = copy / "manifest.json"
    data = json.loads(mf.read_text())
    data["notes"] = {**data.get("notes", {}), "a_nan": float("nan")}
    mf.write_text(json.dumps(data, indent=2, sort_keys=True))
    before, after = compact_manifest(mf)
    assert after < 0.75 * before and mf.read_text() == manifest_text(data)
    again = json.loads(mf.read_text())
    assert again["notes"].pop("a_nan") != again["notes"].get("a_nan")  # NaN, kept
    data["notes"].pop("a_nan")
    assert again == data
    read_back = read_bundle(copy).manifest.to_dict()
    read_back["notes"].pop("a_nan")
    assert read_back == read_bundle(src).manifest.to_dict()
    assert compact_manifest(mf) == (after, after)
    mf.write_text("{not json")
    with pytest.raises(CalibError, match="not valid JSON"):
        compact_manifest(mf)
    assert mf.read_text() == "{not json"


def test_committed_manifests_are_written_as_bundles_write_them() -> None:
    """Every committed bundle's manifest.json is byte for byte what manifest_text makes of it: measure.compact ran over
    them all, and a bundle committed since was written so."""
    from calib.bundle.io import manifest_text

    manifests = sorted(TRACES.glob("*/*/manifest.json"))
    assert len(manifests) > 300
    assert [m for m in manifests if m.read_text() != manifest_text(json.loads(m.read_text()))] == []


def test_a_table_is_the_same_only_bit_for_bit():
    """measure.compact keeps a rewritten table only if it is the same: NaNs equal themselves, nulls stay
    nulls, and one changed value, or a changed pandas metadata, is a difference."""
    import numpy as np
    import pyarrow as pa

    from measure.compact import same_table

    def table(x: float, meta: bytes = b"{}") -> pa.Table:
        t = pa.table({"t": pa.array([1.5, np.nan, None, x]), "h": pa.array(np.array([1, 2, 3, 4], dtype=np.float16)),
                      "s": ["a", None, "c", "d"]})
        return t.replace_schema_metadata({"pandas": meta})

    assert same_table(table(2.0), table(2.0))
    assert not same_table(table(2.0), table(2.0000001))
    assert not same_table(table(2.0), table(2.0, b'{"x": 1}'))
    assert not same_table(table(2.0), table(2.0).slice(0, 3))


def read_et_bytes(data: bytes):
    from calib.chakra.codec import decode

    return decode(data, "<plain>")


def test_memory_probes_are_consistent_where_recorded(bundles: list) -> None:
    """Round 13 on (measure.worker.memory_probe): what each rank held outside torch's allocator and the
    device's used memory are the most seen at the probes, within the device; older bundles record 0."""
    probed = 0
    for b in bundles:
        for m in b.manifest.memory if b.manifest.kind == "training" else []:
            if not m.probes:
                assert m.outside_allocator_bytes == m.device_used_bytes == 0, b.id
                continue
            probed += 1
            assert [p["at"] for p in m.probes] == ["warm-up", "measured steps", "profiled steps"], b.id
            assert m.outside_allocator_bytes == max(p["used_bytes"] - p["reserved_bytes"] for p in m.probes) > 0
            assert m.device_used_bytes == max(p["used_bytes"] for p in m.probes) <= b.manifest.gpu.memory_bytes
            assert m.peak_allocated_bytes <= m.peak_reserved_bytes <= m.device_used_bytes, b.id
    assert probed >= 8


# Raw traces are dropped after conversion (traces/README.md says where the last kept ones are in git's history: the
# raw traces of mixtral-tp2-sp-rcsel-s30, llama8b-tp2-raw and mixtral-ep2-rcfull-raw left the tree in the thirty-eighth
# session, gpt6.7b-tp2-sp-raw's in the fortieth and mixtral-ep2-mbs2-raw's, summarised in
# traces/h200/_probes/routing-waits-ep2, in the fifty-first, to make room for new rounds). gpt6.7b-pp2-mbs2's stay in
# tests/data/h200-pp2-raw, where the conversion tests read them.
KEPT_RAW: set[str] = set()
RAW_TWIN = "gpt6.7b-pp2-mbs2"


def _with_raw(tmp_path: Path):
    """A copy of RAW_TWIN's bundle with its raw traces back in raw/ (as `calib measure train --keep-raw` leaves them)."""
    from tests.conftest import TEST_DATA

    src = next(b for b in load_bundles([TRACES / "h200"]) if b.id == RAW_TWIN)
    copy = tmp_path / src.id
    shutil.copytree(src.path, copy)
    shutil.copytree(TEST_DATA / "h200-pp2-raw", copy / "raw")
    return src, copy


def test_raw_traces_reconvert_to_the_committed_tables(tmp_path: Path) -> None:
    import pandas as pd

    from calib.fit import index_piece_runs
    from calib.ops import REDUCTIONS
    from measure.reconvert import reconvert

    b, copy = _with_raw(tmp_path)
    raw = sorted(p.name for p in (copy / "raw").iterdir())
    world = b.manifest.spec.tp * b.manifest.spec.pp * b.manifest.spec.dp
    assert raw == sorted(f"{k}.{r}.json.xz" for k in ("device", "host") for r in range(world))  # measure.compact
    reconvert(copy)
    pd.testing.assert_frame_equal(pd.read_parquet(copy / "collectives.parquet"),
                                  pd.read_parquet(b.path / "collectives.parquet"))
    now, then = pd.read_parquet(copy / "kernels.parquet"), pd.read_parquet(b.path / "kernels.parquet")
    # The tables were converted before the converter recorded a reduction's shape (m outputs, k reduced into each)
    # and shared an op's bytes among the kernels it is split into past 32-bit indexing (calib.fit.index_piece_runs
    # reads those off an older table, as calib fit does); that, and nothing else, differs.
    gained = then["k"].isna() & now["k"].notna()
    fam = now["aten_op"].str.removeprefix("aten::").str.rstrip("_")
    assert (now.loc[gained, "op_class"] == "memory").all() and fam[gained].isin(REDUCTIONS).all()
    assert gained.any()  # every step sums something (the loss, the gradient norms)
    now.loc[gained, ["m", "k"]] = float("nan")
    pieces = index_piece_runs(then)
    assert (pieces > 1).any() and (index_piece_runs(now) == 1).all()
    pd.testing.assert_frame_equal(now, then.assign(bytes=then["bytes"] / pieces))


ROUND4 = ["gpt13b-pp2-rcfull", "gpt6.7b-pp2-mbs2", "llama8b-pp2vpp2dp2", "llama8b-pp4-rcfull", "llama8b-tp2pp2",
          "llama70b-tp4-rcfull-mbs2", "llama8b-1gpu-mbs2", "gpt6.7b-1gpu-mbs4-rcfull", "mixtral-1gpu",
          "llama8b-tp2-tiers"]


def test_two_tier_telemetry_reaches_20_hz_in_every_column(bundles: list) -> None:
    """Round 4 (two-tier sampler): every column, link counters included, at >= 20 Hz on every GPU."""
    from measure.telemetry import column_rates_hz

    by_id = {b.id: b for b in bundles}
    for rid in ROUND4:
        b = by_id[rid]
        tiers = b.manifest.notes.get("telemetry_tiers")  # written by runs after the first round-4 call
        if tiers is not None:
            assert set(tiers) == {"fast", "links"}, rid
            assert all(min(t["rate_hz"].values()) >= 20 for t in tiers.values()), rid
        tel = b.table("telemetry")
        for hz in column_rates_hz(tel, tel["t_s"].max() - tel["t_s"].min()).values():
            for col in ("power_w", "temp_gpu_c", "util_gpu", "nvlink_tx_bytes", "pcie_rx_bytes"):
                assert hz[col] >= 20, (rid, col)


def test_telemetry_twins_record_their_overhead(bundles: list) -> None:
    # Twins share a GPU folder: an H100 run without telemetry is no twin of the H200 run of the same id.
    by_id = {(b.path.parent.name, b.id): b for b in bundles}
    twins = [(k, (k[0], k[1] + "-notel")) for k in by_id if (k[0], k[1] + "-notel") in by_id]
    assert len(twins) >= 2
    for on, off in twins:
        m_on, m_off = by_id[on].manifest, by_id[off].manifest
        assert m_on.spec.key() == m_off.spec.key()
        assert m_on.telemetry.enabled and not m_off.telemetry.enabled
        assert m_on.telemetry.overhead_fraction is not None and abs(m_on.telemetry.overhead_fraction) < 0.1
        tel = by_id[on].table("telemetry")
        assert m_on.telemetry.rate_hz >= 20 and not tel["power_w"].isna().any()


def test_microbenchmarks_on_both_gpus(bundles: list) -> None:
    kinds = {(b.path.parent.name, b.manifest.kind) for b in bundles}
    assert {("h200", "collectives"), ("h200", "kernels"), ("h100", "kernels")} <= kinds
    coll = [b for b in bundles if b.id == "collectives-4gpu"][0].table("collectives")
    assert set(coll["kind"]) == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"}
    assert coll["bytes"].min() <= 1024 and coll["bytes"].max() >= 2**30
    big = coll[(coll.kind == "all_reduce") & (coll.group_size == 4) & (coll.bytes >= 2**30 - 1024)]
    assert 200 < big["busbw_gbps"].iloc[0] < 450  # NVLink NV18 all-reduce busbw on H200, nccl-tests GB/s


def test_twins_on_two_gpu_models_are_refused() -> None:
    """The same spec without telemetry on another GPU model is no telemetry twin: one clear error, no
    overhead written."""
    from measure.campaigns.twins import overhead_fraction

    on, off = TRACES / "h200" / "gpt6.7b-tp4-mbs2", TRACES / "h100" / "gpt6.7b-tp4-mbs2-notel"
    if not (on.is_dir() and off.is_dir()):
        pytest.skip("the 4-GPU GPT-3 6.7B runs are not committed")
    with pytest.raises(CalibError, match="not twins: they ran on NVIDIA H200"):
        overhead_fraction(on, off)
