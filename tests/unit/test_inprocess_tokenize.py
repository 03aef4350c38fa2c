"""The tokenize step's batch answer (triton_models/inprocess/tokenize_path.py): rows padded to the batch's widest."""

import numpy as np

from tpserve.triton_models.inprocess.tokenize_path import pad_together


def test_every_request_keeps_its_rows_in_order_padded_to_the_widest():
    a = (np.array([[1, 2, 3]]), np.array([[1, 1, 1]]))
    b = (np.array([[4, 5, 0], [6, 0, 0]])[:, :2], np.array([[1, 1, 0], [1, 0, 0]])[:, :2])
    c = (np.array([[7, 8, 9, 10, 11]]), np.ones((1, 5), np.int64))
    ids, mask, rows = pad_together([a, b, c])
    assert rows.tolist() == [1, 2, 1]
    assert ids.tolist() == [[1, 2, 3, 0, 0], [4, 5, 0, 0, 0], [6, 0, 0, 0, 0], [7, 8, 9, 10, 11]]
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]]
    assert ids.dtype == mask.dtype == np.int64 and ids.flags.c_contiguous


def test_one_request_is_answered_as_it_is():
    ids = np.arange(6, dtype=np.int64).reshape(2, 3)
    got, mask, rows = pad_together([(ids, np.ones_like(ids))])
    assert np.array_equal(got, ids) and rows.tolist() == [2] and mask.sum() == 6


def test_a_batch_that_cannot_be_padded_is_refused_request_by_request_not_half_answered():
    from tpserve.triton_models.inprocess.answers import Answers
    from tpserve.triton_models.inprocess.tokenize_path import TokenizeBatch

    failed = []

    class Refusals(Answers):  # the explicit object the path answers through; here it only notes refusals
        def fail(self, request, err, start):
            failed.append(request)

    outputs = [("input_ids", "INT64"), ("attention_mask", "INT64")]
    answers = Refusals(api=None, calls=None, handle=1, name="tokenize", outputs=outputs, write_output=None)
    batch = TokenizeBatch(answers, read_and_run=None, calls=None, api=None)  # never reached: nothing is answered
    batch._answer(np.array([7, 8], np.uint64), [("not", "arrays"), ("at", "all")], 0, 0)
    assert failed == [7, 8]
