"""What an artifact must pass before it is written: numerics against PyTorch, the serving host's guard, CPU speed."""
