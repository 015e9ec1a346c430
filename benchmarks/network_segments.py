"""Does a piecewise log-size residual help the collective model on held-out sizes?

    python benchmarks/network_segments.py [BUNDLE_DIRS...]      # default: traces/h200 traces/h100

calib.models.network.Series.fit can add a clamped piecewise-linear residual in log size
(`max_segments`); `calib fit` uses none. This refits every series with 0-3 segments and prints the
cross-validated error of `calib fit`'s `network` figure (5-fold over sizes, sizes >= 1 MiB), overall and
per source (microbenchmarks / profiled training steps), for each folder.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str]) -> int:
    import calib.models.network as network
    from calib.bundle.io import load_bundles
    from calib.fit import (
        FitOptions,
        _series_points,
        collective_points,
        fit_network,
        network_fold_predictions,
        select_bundles,
    )

    original = network.Series.fit.__func__  # type: ignore[attr-defined]
    for folder in argv or [str(ROOT / "traces" / "h200"), str(ROOT / "traces" / "h100")]:
        micro, train = collective_points(select_bundles(load_bundles([folder]), FitOptions()))
        for segments in range(4):
            def fit(cls, domain, kind, n, nbytes, t, max_segments=0, bench=None, loop=None, micro=None,  # noqa: ANN001, ANN202
                    _s=segments):
                return original(cls, domain, kind, n, nbytes, t, _s, bench, loop, micro)

            network.Series.fit = classmethod(fit)  # type: ignore[method-assign, assignment]
            try:
                model, _, _ = fit_network(micro, train, 8, FitOptions())
                fits = {k: g for k, g in _series_points(micro, train).items() if model.key(*k) in model.series}
                cv = network_fold_predictions(fits, model, FitOptions().folds)
            finally:
                network.Series.fit = classmethod(original)  # type: ignore[method-assign, assignment]
            big = cv[cv["bytes"] >= 2**20]
            err = 100 * (big["pred"] - big["meas"]).abs() / big["meas"]
            print(f"{folder}: {segments} segment(s): {err.mean():.2f} % over {len(big)} points "
                  f"(microbenchmarks {err[big['bench']].mean():.2f} %, training steps {err[~big['bench']].mean():.2f} %)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
