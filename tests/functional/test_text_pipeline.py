"""minilm_pipeline on the real server vs sentence-transformers in-process."""

import concurrent.futures

import numpy as np
import pytest

from tpserve.builders.spec.zoo.text import SENTENCES, model_dir
from tpserve.clients.infer import infer
from tpserve.common.errors import ClientError

pytestmark = pytest.mark.functional


@pytest.fixture(scope="module")
def reference():
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir()), device="cpu")
    return model.encode(list(SENTENCES), normalize_embeddings=True)


def _texts(items):
    return np.array([[t.encode("utf-8")] for t in items], dtype=object)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_served_embeddings_match_sentence_transformers(served, reference, protocol):
    assert len(SENTENCES) >= 50
    ep = served.endpoint(protocol)
    with ep.client() as client:
        one_by_one = [
            infer(ep, "minilm_pipeline", {"TEXT": _texts([s])}, client=client).outputs["EMBEDDING"][0]
            for s in SENTENCES
        ]
        batched = infer(ep, "minilm_pipeline", {"TEXT": _texts(SENTENCES[:8])}, client=client).outputs["EMBEDDING"]
    cosine = np.sum(np.stack(one_by_one) * reference, axis=1)
    assert cosine.min() >= 0.999, (cosine.min(), SENTENCES[int(cosine.argmin())])
    assert np.sum(batched * reference[:8], axis=1).min() >= 0.999  # padded batch: mask keeps it exact
    np.testing.assert_allclose(np.linalg.norm(np.stack(one_by_one), axis=1), 1.0, atol=1e-5)


def test_empty_and_blank_texts_are_refused_and_others_succeed(served, reference):
    ep = served.endpoint("grpc")
    cases = {"empty": "", "blank": " \t\n ", "good": SENTENCES[6], "bad utf-8": None}

    def send(item):
        name, text = item
        payload = np.array([[b"\xff\xfe broken"]], dtype=object) if text is None else _texts([text])
        try:
            return name, infer(ep, "minilm_pipeline", {"TEXT": payload}).outputs["EMBEDDING"]
        except ClientError as err:
            return name, str(err)

    with concurrent.futures.ThreadPoolExecutor(len(cases)) as pool:
        results = dict(pool.map(send, cases.items()))
    assert float(np.sum(results["good"][0] * reference[6])) >= 0.999
    for name, reason in (("empty", "empty or whitespace"), ("blank", "empty or whitespace"), ("bad utf-8", "UTF-8")):
        assert "INVALID_ARG" in results[name] and "tokenize: text 0" in results[name], results[name]
        assert reason in results[name]
    with ep.client() as client:
        assert client.is_server_live()
