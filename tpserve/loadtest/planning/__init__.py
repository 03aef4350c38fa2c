"""`plan`: how much to run for GROWTH times a recording's traffic at a p99 SLO, found by replaying it."""
