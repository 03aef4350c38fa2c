"""Plumbing every layer shares: the error hierarchy, CLI helpers and options, endpoint and server-state records."""
