"""Model and parallelism specs, and generation of one training step's workload."""
