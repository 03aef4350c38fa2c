"""reports: the run report, plots, the server's own view of a window."""
