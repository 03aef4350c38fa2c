"""Serving code without Triton's API: the torch runtime, ragged planning and running, the tokenizer core. Imported
by the stubs, the in-process backend, the builders and the benches."""
