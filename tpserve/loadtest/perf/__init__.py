"""perf_analyzer: its install, sweeps, one `loadtest perf` run."""
