"""Prometheus (install, server, rules), the dashboard, Kubernetes monitoring manifests."""
