"""Clients: a thin layer over tritonclient (HTTP and gRPC) and the user-facing client commands."""
