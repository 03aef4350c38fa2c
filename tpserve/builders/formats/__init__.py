"""The artifacts a build makes from a spec: ONNX (export, import, INT8), torch-runtime variants,
torch.compile engines, TensorRT plans."""
