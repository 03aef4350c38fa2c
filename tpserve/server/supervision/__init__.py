"""The supervisor: probes, reloads, restarts, readiness, rollouts' lock."""
