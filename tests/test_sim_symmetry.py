"""Symmetry on the workload generator's own output: one trace per pipeline stage gives exactly the
answer of simulating every rank's materialized trace."""

from __future__ import annotations

import pytest

from calib.sim import Dim, NetworkConfig, SimWorkload, SystemConfig, simulate

generate_mod = pytest.importorskip("calib.workload.generate", reason="the workload generator (issue 6) is not in this tree")


def _kernel_time(df):
    # Synthetic op times (a known function of the op records): this test checks the simulator, not a model.
    return df["flops"].to_numpy(float) / 5e14 + df["bytes"].to_numpy(float) / 3e12


def test_stage_classes_match_per_rank_simulation():
    from calib.workload.models import resolve_model
    from calib.workload.parallel import ParallelConfig

    model = resolve_model("gpt3-1.3b@L4,S512")
    par = ParallelConfig(tp=2, pp=2, dp=4, micro_batch=1, global_batch=16, sequence_parallel=True,
                         overlap_grad_reduce=True, distributed_optimizer=True)
    step = generate_mod.generate(model, par, _kernel_time)
    net = NetworkConfig((Dim("Switch", 8, 360.0, 500.0), Dim("Switch", 2, 50.0, 2000.0)))
    impl = ["ring", "ring"]
    system = SystemConfig(preferred_dataset_splits=2, local_mem_bw_gbps=1600.0, all_reduce_impl=impl,
                          reduce_scatter_impl=impl, all_gather_impl=impl, all_to_all_impl=impl)
    by_class = simulate(step.workload, net, system)
    full = SimWorkload.per_rank({r: step.materialize(r) for r in range(par.gpus)}, step.workload.comm_groups)
    by_rank = simulate(full, net, system)
    assert by_class.simulated_ranks == par.pp and by_rank.simulated_ranks == par.gpus
    assert by_class.finish_ns == by_rank.finish_ns
    assert by_class.exposed_comm_ns == by_rank.exposed_comm_ns
    assert by_class.busy_ns[0]["compute"] > 0 and "tp" in by_class.busy_ns[0] and "pp" in by_class.busy_ns[0]
