"""Measurement: perf_analyzer sweeps, Locust suites, config search and reports."""
