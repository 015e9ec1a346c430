"""Held-out results are reused only for the same code and the same bundles (calib.validation.cache)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calib.bundle.io import update_notes
from calib.validate import run_validation
from calib.validation import cache
from calib.validation.types import HELDOUT
from tests.fitdata import write_validation_set


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return write_validation_set(tmp_path / "traces")


def _heldout(root: Path, **kw: object) -> tuple[dict[str, float], list[str]]:
    rep = run_validation([root], out_dir=None, write_calibration=False, replay=False, in_sample=False, **kw)
    return {r.run: r.predicted_step_s for r in rep.of_kind(HELDOUT)}, rep.notes


def _reused(notes: list[str]) -> list[str]:
    return [n for n in notes if "read from the cache" in n]


def test_second_validation_reads_the_same_results_back(root: Path) -> None:
    first, notes = _heldout(root, jobs=2)  # worker processes; the second run reads back in this one
    assert set(first) == {"t1", "t2", "t3"} and all(v and v > 0 for v in first.values()) and not _reused(notes)
    assert len(list((cache.cache_dir() / "heldout").glob("*.json"))) == 3
    again, notes = _heldout(root)
    assert again == first and len(_reused(notes)) == 1 and "3 of 3" in _reused(notes)[0]


def test_changed_bundle_code_or_no_cache_recomputes(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _heldout(root)
    # one bundle changes: every configuration's key holds it (left out or fitted on), none is reused
    update_notes(root / "t2", {"touched": True})
    assert not _reused(_heldout(root)[1])
    assert _reused(_heldout(root)[1])
    monkeypatch.setattr(cache, "code_digest", lambda: "other code")
    assert not _reused(_heldout(root)[1])
    stored = sorted((cache.cache_dir() / "heldout").glob("*.json"))
    _, notes = _heldout(root, cache=False)  # neither read nor written
    assert not _reused(notes) and sorted((cache.cache_dir() / "heldout").glob("*.json")) == stored


def test_unreadable_or_foreign_entries_are_recomputed(root: Path) -> None:
    first, _ = _heldout(root)
    files = sorted((cache.cache_dir() / "heldout").glob("*.json"))
    files[0].write_text("{not json")
    data = json.loads(files[1].read_text())
    data["key"] = "another key"
    files[1].write_text(json.dumps(data))
    again, notes = _heldout(root)
    assert again == first and "1 of 3" in _reused(notes)[0]  # the intact entry only


def test_only_complete_results_are_kept(tmp_path: Path) -> None:
    failed = {"note": "fit without this configuration failed: too few points", "predictions": {}}
    partial = {"note": "", "predictions": {"a": {"step_s": 1.0}, "b": {"note": "held-out prediction failed"}}}
    ok = {"note": "", "predictions": {"a": {"step_s": 1.0, "breakdown_s": {}, "energy_j": None}}}
    assert [cache.store_heldout(k, r) for k, r in (("f", failed), ("p", partial), ("o", ok))] == [False, False, True]
    assert cache.load_heldout("f") is None and cache.load_heldout("o") == ok


def test_key_follows_bundle_names_and_contents(root: Path) -> None:
    key = cache.heldout_key([str(root / "t1")], [str(root / "t2"), str(root / "k")])
    assert key == cache.heldout_key([str(root / "t1")], [str(root / "t2"), str(root / "k")])
    assert key != cache.heldout_key([str(root / "t1")], [str(root / "k"), str(root / "t2")])  # fit order
    assert key != cache.heldout_key([str(root / "t2")], [str(root / "t1"), str(root / "k")])
    (root / "k").rename(root / "k2")
    assert key != cache.heldout_key([str(root / "t1")], [str(root / "t2"), str(root / "k2")])


def test_unusable_cache_folder_only_costs_the_reuse(root: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(cache.CACHE_ENV, str(blocker))
    first, notes = _heldout(root)
    again, notes2 = _heldout(root)
    assert again == first and all(v and v > 0 for v in first.values()) and not _reused(notes + notes2)


def test_command_line_no_cache(root: Path, tmp_path: Path) -> None:
    from calib.cli import main

    args = ["validate", str(root), "--no-replay", "--no-write-calibration"]
    assert main([*args, "--out", str(tmp_path / "a"), "--no-cache"]) == 0
    assert not (cache.cache_dir() / "heldout").exists()
    assert main([*args, "--out", str(tmp_path / "b")]) == 0
    assert main([*args, "--out", str(tmp_path / "c")]) == 0
    notes = json.loads((tmp_path / "c" / "validation.json").read_text())["notes"]
    assert _reused(notes) and not _reused(json.loads((tmp_path / "b" / "validation.json").read_text())["notes"])


def test_code_digest_covers_the_model_code_but_not_the_report_writer(monkeypatch, tmp_path) -> None:
    pkg = tmp_path / "calib"
    for rel in ("models/kernel.py", "validation/report.py", "commands/measure.py", "cli.py", "data/calibration-h200.yaml"):
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text("x = 1\n")
    monkeypatch.setattr(cache, "PACKAGE", pkg)

    def digest() -> str:
        cache.code_digest.cache_clear()
        return cache.code_digest()

    base = digest()
    for rel in ("validation/report.py", "commands/measure.py", "cli.py", "data/calibration-h200.yaml"):
        (pkg / rel).write_text("x = 2\n")
        assert digest() == base, rel
    (pkg / "models/kernel.py").write_text("x = 2\n")
    assert digest() != base
    cache.code_digest.cache_clear()


def test_a_process_reads_a_bundle_once_and_derives_its_points_once(root: Path) -> None:
    """Held-out fits in one process share the bundles they read and the points derived from each
    (calib.validate._read_once, Bundle.derived); a new validation reads them again, since a bundle may have
    changed in between."""
    from unittest import mock

    from calib import fit, validate

    path = str(next(p for p in sorted(root.iterdir()) if (p / "kernels.parquet").is_file()))
    validate._READ.clear()
    b = validate._read_once(path)
    assert validate._read_once(path) is b
    with mock.patch.object(fit, "_kernel_frame", wraps=fit._kernel_frame) as frame:
        first, _ = fit.kernel_rows([b])
        again, _ = fit.kernel_rows([validate._read_once(path)])
    assert frame.call_count == 1 and first.equals(again)
    assert b.derived("k", lambda: 1) == 1 and b.derived("k", lambda: 2) == 1  # computed once per key
    _heldout(root)
    assert validate._READ == {}  # emptied when a validation ends (and when one starts)
