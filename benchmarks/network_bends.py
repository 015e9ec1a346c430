"""The network model's bends, taken four ways: where the 5-fold error over message sizes comes from.

    python benchmarks/network_bends.py [BUNDLE_DIRS...]      # default: traces/h200 (about 2 min)

calib.models.network.Bends interpolates, between kernel-timed sizes measured at most 1.5x apart, the ratio of
the measured time to the smooth form, the sizes' median times first made non-decreasing in size (isotonic least
squares); `Series._bent` keeps each size at or under the least time of the profile's points above it, so a
larger message is never predicted faster. Without the isotonic step, that envelope alone lowers a cluster of
slow training sizes to a faster microbenchmark size above it: an MoE all-to-all of 8.4-9.5 MiB (26-28 us in
training) to the 22 us of the 9.5-10 MiB microbenchmark, which took the H200's mixtral-ep2-s256 runs 3 points
fast (the forty-eighth session). This scores, with the cross-validation `calib fit` reports as `network`
(calib.fit.network_fold_predictions), the model

- `smooth`: with no bends (as before round 39's dense sizes),
- `as fitted`: isotonic knots and the envelope (calib as it is),
- `medians`: the knots' median times as they are, and the envelope (the forty-eighth session's form),
- `no envelope`: the median knots alone, whose predictions fall with size in places,

and how far each lets a time fall as the size grows (on a grid of 40 sizes per doubling).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without `pip install -e .`


def _variant(name: str) -> None:
    """Patch calib.models.network for one variant (this process only)."""
    import calib.models.network as net

    fit = net.Series.fit.__func__  # type: ignore[attr-defined]
    bends_fit = net.Bends.fit.__func__  # type: ignore[attr-defined]
    bent = net.Series._bent

    def patched_fit(cls: type, *a: object, **k: object) -> object:
        ser = fit(cls, *a, **k)
        if name == "smooth":
            ser.bends = net.Bends()
        return ser

    def medians(cls: type, *a: object, **k: object) -> object:
        return bends_fit(cls, *a, **k, monotone=False)

    def raw(self: object, s: np.ndarray, alpha: float) -> np.ndarray:
        return self._smooth(s, self.group_size, alpha) * np.exp(self.bends(np.log10(np.maximum(s, 1.0))))  # type: ignore[attr-defined]

    net.Series.fit = classmethod(patched_fit)  # type: ignore[method-assign]
    if name in ("medians", "no envelope"):
        net.Bends.fit = classmethod(medians)  # type: ignore[method-assign]
    net.Series._bent = raw if name == "no envelope" else bent  # type: ignore[method-assign]


def main(argv: list[str]) -> int:
    import multiprocessing as mp

    paths = argv or [str(ROOT / "traces" / "h200")]
    names = ["smooth", "as fitted", "medians", "no envelope"]
    with mp.get_context("spawn").Pool(2, maxtasksperchild=1) as pool:  # a fresh process per variant: patches must not carry over
        rows = pool.starmap(_score, [(n, paths) for n in names])
    print(f"{'variant':12s} {'all':>6s} {'train':>6s} {'bench':>6s} {'bench 2^k':>9s} {'n':>5s}   largest fall with size, %")
    for name, r in zip(names, rows, strict=True):
        print(f"{name:12s} {r['all']:6.2f} {r['trace']:6.2f} {r['bench']:6.2f} {r['pow2']:9.2f} {r['n']:5d}   {r['fall']}")
    return 0


def _score(name: str, paths: list[str]) -> dict:
    import pandas as pd

    import calib.fit as cf
    from calib.bundle.io import load_bundles

    _variant(name)
    opts = cf.FitOptions()
    micro, train = cf.collective_points(cf.select_bundles(load_bundles(paths), opts))
    model, _, _ = cf.fit_network(micro, train, 8, opts)
    fits = {k: g for k, g in cf._series_points(micro, train).items() if model.key(*k) in model.series}
    cv = cf.network_fold_predictions(fits, model, opts.folds)
    cv = cv[cv["bytes"] >= 2**20]
    err = 100 * (cv["pred"] - cv["meas"]).abs() / cv["meas"]
    pow2 = cv["bench"] & np.isclose(np.log2(cv["bytes"]) % 1, 0)
    grid = 2.0 ** np.arange(10, 30, 1 / 40)
    fall = {}
    for key, ser in model.series.items():
        if ser.bends.knots:
            t = np.asarray(model.predict(ser.kind, ser.group_size, grid, domain=ser.domain))
            fall[key.split("/", 1)[1]] = round(float(100 * min(0.0, (np.diff(t) / t[:-1]).min())), 2)
    return {"all": float(err.mean()), "trace": float(err[~cv["bench"]].mean()), "bench": float(err[cv["bench"]].mean()),
            "pow2": float(err[pow2].mean()), "n": int(len(cv)), "fall": pd.Series(fall).to_dict()}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
