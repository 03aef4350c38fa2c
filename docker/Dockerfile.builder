# Engine builder: the NGC TensorRT container of the server's release, with this project installed.
ARG NGC_RELEASE=25.08
FROM nvcr.io/nvidia/tensorrt:${NGC_RELEASE}-py3

WORKDIR /workspace/project
COPY pyproject.toml constraints.txt README.md Makefile ./
COPY tpserve ./tpserve
RUN python3 -m pip install --no-cache-dir -c constraints.txt . \
    && python3 -c "import tensorrt, tpserve.builders; print('TensorRT', tensorrt.__version__)"

ENTRYPOINT ["python3", "-m", "tpserve.builders"]
CMD ["--help"]
