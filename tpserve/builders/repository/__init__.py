"""The Triton model repository: model folders and configs, pipelines (ensembles), the manifest."""
