"""benches: GPU, text, batching, Envoy, multi-GPU, request profile, cluster faults, soak, Locust vs perf_analyzer."""
