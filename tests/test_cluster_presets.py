"""Cluster presets: every value cited or marked calibrated, networks for 1..32,768 GPUs, bad input."""

from __future__ import annotations

import math

import pytest
import yaml

from calib.cluster import SIMCONFIGS, available, load_cluster
from calib.errors import CalibError


def test_every_preset_loads_and_cites_its_values() -> None:
    names = available()
    for want in ("dgx-h200", "dgx-h100", "mi250", "h100-1", "h100-2", "h100-4", *[f"h200-{n}" for n in range(1, 9)]):
        assert want in names
    for name in names:
        c = load_cluster(name)
        for key, v in c.provenance(c.gpus_per_node).items():
            assert v.source, key
        assert c.peak_flops_per_s > 1e14 and c.hbm_bytes > 1e10 and c.tdp_w > 100


@pytest.mark.parametrize("gpus", [1, 2, 8, 16, 256, 1024, 8192, 16384, 32768])
def test_superpod_network_any_size(gpus: int) -> None:
    c = load_cluster("dgx-h200")
    net = c.network(gpus)
    assert net.npus == gpus
    assert net.dims[0].npus == min(gpus, 8)
    if gpus > 8:
        # dimension 1 carries one NIC per GPU: 400 Gb/s = 50e9 B/s, in ASTRA-sim's GB/s of 2^30 bytes
        assert net.dims[1].bandwidth_gbps == pytest.approx(50e9 / 2**30)
    if gpus > 8 * 32:
        assert len(net.dims) == 3 and net.dims[1].npus == 32
    sysc = c.system(gpus)
    assert len(sysc.all_reduce_impl) == len(net.dims)
    assert sysc.local_mem_bw_gbps == pytest.approx(4800)


def test_partial_leaf_group_uses_spine_rate(tmp_path) -> None:
    data = yaml.safe_load((SIMCONFIGS / "dgx-h100.yaml").read_text())
    data["network"]["spine_oversubscription"] = {"value": 2.0, "source": "test: 2:1 spine"}
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(data))
    c = load_cluster(str(p))
    three = c.network(8 * 64)
    assert three.dims[2].bandwidth_gbps == pytest.approx(three.dims[1].bandwidth_gbps / 2)
    partial = c.network(8 * 40)  # 40 nodes: not whole leaf groups of 32
    assert [d.npus for d in partial.dims] == [8, 40]
    assert partial.dims[1].bandwidth_gbps == pytest.approx(three.dims[2].bandwidth_gbps)


def test_bad_sizes_and_unknown_cluster() -> None:
    c = load_cluster("dgx-h200")
    with pytest.raises(CalibError, match="not a multiple of the node size 8"):
        c.network(12)
    with pytest.raises(CalibError, match="at most 32768"):
        c.network(65536)
    with pytest.raises(CalibError, match="at most 8 GPUs"):
        load_cluster("h200-8").network(16)
    with pytest.raises(CalibError, match="unknown cluster 'dgx-b999'"):
        load_cluster("dgx-b999")


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda d: d["memory"].pop("hbm_bytes"), "memory lacks 'hbm_bytes'"),
        (lambda d: d["processor"]["tdp_w"].pop("source"), "processor.tdp_w.source: every configured value must name its source"),
        (lambda d: d["network"]["dims"][0].update(topology="Torus"), r"network.dims\[0\].topology"),
        (lambda d: d["processor"]["tdp_w"].update(value="hot"), "processor.tdp_w.value: not a number"),
        (lambda d: d.update(colour="green"), "unknown key"),
    ],
)
def test_bad_preset_names_the_key(tmp_path, edit, message: str) -> None:
    data = yaml.safe_load((SIMCONFIGS / "dgx-h200.yaml").read_text())
    edit(data)
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(CalibError, match=message):
        load_cluster(str(p))


def test_mi250_is_per_gcd() -> None:
    c = load_cluster("mi250")
    assert c.gpus_per_node == 8 and c.gpu == "MI250"
    assert math.isclose(c.peak_flops_per_s, 362.1e12 / 2)
    assert c.network(16).dims[0].topology == "FullyConnected"
