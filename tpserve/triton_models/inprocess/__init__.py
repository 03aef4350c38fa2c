"""The in-process backend: Python embedded in tritonserver's own process (its request paths, the Triton API
binding, the tokenize step), with its C under native/."""
