"""Image pipeline ensembles on the real server: bytes and uint8 inputs, per-request errors, breakdown."""

import concurrent.futures
import io
import subprocess
import sys

import numpy as np
import pytest

from tpserve.clients.breakdown import breakdown
from tpserve.clients.infer import infer
from tpserve.common.errors import ClientError

pytestmark = pytest.mark.functional


def _digit_pngs(served, count):
    from PIL import Image

    spec, built = served.models["digits_cnn"]
    images, labels = [], []
    for i in range(count):
        pixels = (built.sample_data["x"][i, 0] * spec.preprocessing.std[0] + spec.preprocessing.mean[0]) * 255
        buffer = io.BytesIO()
        Image.fromarray(pixels.round().astype(np.uint8)).resize((32, 32)).save(buffer, format="PNG")
        images.append(buffer.getvalue())
        labels.append(int(built.sample_data["y"][i]))
    return images, labels


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_png_bytes_come_back_with_the_right_labels(served, protocol):
    images, labels = _digit_pngs(served, 12)
    batch = np.array(images, dtype=object).reshape(-1, 1)
    out = infer(served.endpoint(protocol), "digits_cnn_pipeline", {"IMAGE": batch}).outputs
    assert out["CLASS_IDS"].shape == (12, 3) and out["SCORES"].shape == (12, 3)
    assert np.mean(out["CLASS_IDS"][:, 0] == labels) >= 0.9
    assert [label.decode() for label in out["LABELS"][:, 0]] == [str(i) for i in out["CLASS_IDS"][:, 0]]
    assert np.all(np.diff(out["SCORES"], axis=1) <= 0) and np.all(out["SCORES"].sum(axis=1) <= 1.0001)


def test_the_uint8_pipeline_agrees_with_the_bytes_one(served):
    from PIL import Image

    images, _ = _digit_pngs(served, 6)
    pixels = np.stack([np.asarray(Image.open(io.BytesIO(b)).convert("L").resize((8, 8)))[..., None] for b in images])
    ep = served.endpoint("grpc")
    raw = infer(ep, "digits_cnn_pipeline_u8", {"IMAGE": pixels.astype(np.uint8)}).outputs
    coded = infer(ep, "digits_cnn_pipeline", {"IMAGE": np.array(images, dtype=object).reshape(-1, 1)}).outputs
    np.testing.assert_array_equal(raw["CLASS_IDS"], coded["CLASS_IDS"])
    np.testing.assert_allclose(raw["SCORES"], coded["SCORES"], atol=1e-5)


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height pixels and holds none (a decompression bomb's header)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
        + chunk(b"IEND", b"")
    )


def test_bad_images_fail_alone_naming_the_step_and_the_rest_succeed(served):
    from PIL import Image

    images, labels = _digit_pngs(served, 4)
    huge = io.BytesIO()
    Image.new("L", (5000, 5000)).save(huge, format="PNG")
    cases = {
        "good": images[0],
        "corrupt": b"\x89PNG\r\n\x1a\nnot really",
        "truncated": images[1][:40],
        "empty": b"",
        "too large": huge.getvalue(),
        "bomb header": png_header_only(60000, 60000),
        "good2": images[2],
    }
    ep = served.endpoint("grpc")

    def send(item):
        name, blob = item
        try:
            return name, infer(ep, "digits_cnn_pipeline", {"IMAGE": np.array([[blob]], dtype=object)}).outputs
        except ClientError as err:
            return name, str(err)

    with concurrent.futures.ThreadPoolExecutor(len(cases)) as pool:  # concurrent: one dynamic batch
        results = dict(pool.map(send, cases.items()))
    assert int(results["good"]["CLASS_IDS"][0, 0]) == labels[0]
    assert int(results["good2"]["CLASS_IDS"][0, 0]) == labels[2]
    for name, reason in (
        ("corrupt", "could not be decoded"),
        ("truncated", "could not be decoded"),
        ("empty", "is empty"),
        ("too large", "over the limit"),
        ("bomb header", "over the limit"),
    ):
        assert "INVALID_ARG" in results[name] or "400" in results[name], results[name]
        assert "preprocess: image 0" in results[name] and reason in results[name], results[name]
    with ep.client() as client:
        assert client.is_server_live()


def test_latency_breakdown_names_every_step(served):
    images, _ = _digit_pngs(served, 2)
    ep = served.endpoint("http")
    infer(ep, "digits_cnn_pipeline", {"IMAGE": np.array(images, dtype=object).reshape(-1, 1)})
    rows = breakdown(ep, "digits_cnn_pipeline")
    assert [r["model"] for r in rows] == [
        "digits_cnn_preprocess",
        "digits_cnn",
        "digits_cnn_postprocess",
        "digits_cnn_pipeline",
    ]
    assert all(r["requests"] >= 1 for r in rows) and rows[1]["compute_infer_us"] > 0
    done = subprocess.run(
        [sys.executable, "-m", "tpserve.clients", "stats", "digits_cnn_pipeline", "--state-dir", str(served.state_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and "| digits_cnn_preprocess |" in done.stdout
