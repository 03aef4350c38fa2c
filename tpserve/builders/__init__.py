"""Builders, by stage: spec/ (what a model is), formats/ (the artifacts made from it), checks/ (what they must
pass), repository/ (the Triton model repository they are written into); build.py runs one model through them."""
