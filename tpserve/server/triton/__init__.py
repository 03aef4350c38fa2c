"""tritonserver itself: launching it, its preloads (the shim and the guard), the in-process backend's build."""
