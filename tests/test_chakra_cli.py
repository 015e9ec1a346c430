"""`calib trace show | check | convert` through the real CLI entry point."""

from __future__ import annotations

from pathlib import Path

import pytest

from calib.cli import main


def test_show(astra_cases: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", "show", str(astra_cases / "sendrecv_ring8" / "wl.0.et")]) == 0
    out = capsys.readouterr().out
    assert "COMM_SEND_NODE" in out and "SEND" in out and "1,048,576" in out


def test_check_good_and_bad(astra_cases: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = astra_cases / "allreduce_ring8_1MiB_ring_s1a1" / "wl.0.et"
    bad = tmp_path / "bad.et"
    bad.write_bytes(good.read_bytes()[:-4])
    missing = tmp_path / "missing.et"
    assert main(["trace", "check", str(good)]) == 0
    assert main(["trace", "check", str(good), str(bad), str(missing)]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-3].endswith("ok") and lines[-3].startswith(str(good))
    assert lines[-2].startswith(f"{bad}: truncated Chakra ET")
    assert lines[-1].startswith(f"{missing}: cannot read")


def test_convert_dir_then_check_and_show(samples: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "et"
    assert main(["trace", "convert", "--dir", str(samples / "h200x2-collectives"), "-o", str(out)]) == 0
    assert main(["trace", "check", str(out / "rank.0.et"), str(out / "rank.1.et")]) == 0
    assert main(["trace", "show", str(out / "rank.1.et")]) == 0
    text = capsys.readouterr().out
    assert "COMM_RECV_NODE" in text and "REDUCE_SCATTER" in text


def test_convert_errors_are_one_line(samples: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = samples / "h200x2-collectives"
    rc = main(["trace", "convert", str(d / "host.0.json.gz"), str(d / "device.1.json.gz"), "-o", str(tmp_path / "r.et")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: ") and err.count("\n") == 1
    assert not (tmp_path / "r.et").exists()
    assert main(["trace", "convert", "-o", str(tmp_path / "r.et")]) == 2


def test_json_export(astra_cases: Path, tmp_path: Path) -> None:
    import json

    from calib.chakra.codec import encode, read_et
    from calib.chakra.jsonio import from_json

    src = astra_cases / "sendrecv_ring8" / "wl.1.et"
    out = tmp_path / "wl.1.json"
    assert main(["trace", "json", str(src), "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["schema"] == "calib.chakra-json/1"
    assert encode(from_json(data)) == encode(read_et(src)) == src.read_bytes()


def test_convert_warns_in_one_line_on_an_untested_schema(samples: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    import gzip
    import json

    d = samples / "h200x2-mcore-tp2"
    with gzip.open(d / "host.0.json.gz") as f:
        host = json.load(f)
    host["schema"] = "1.2.0-chakra.0.0.4"
    p = tmp_path / "host.0.json.gz"
    p.write_bytes(gzip.compress(json.dumps(host).encode()))
    assert main(["trace", "convert", str(p), str(d / "device.0.json.gz"), "-o", str(tmp_path / "rank.0.et")]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: ") and "1.2.0-chakra.0.0.4" in err[0]
