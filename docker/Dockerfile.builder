# Engine builder: the NGC TensorRT container of the server's release, with this project installed.
ARG NGC_RELEASE=25.08
FROM nvcr.io/nvidia/tensorrt:${NGC_RELEASE}-py3

WORKDIR /workspace/project
COPY pyproject.toml README.md Makefile ./
COPY builders ./builders
COPY common ./common
COPY triton_models ./triton_models
COPY clients ./clients
COPY loadtest ./loadtest
COPY operations ./operations
COPY server ./server
RUN python3 -m pip install --no-cache-dir . \
    && python3 -c "import tensorrt, builders; print('TensorRT', tensorrt.__version__)"

ENTRYPOINT ["python3", "-m", "builders"]
CMD ["--help"]
