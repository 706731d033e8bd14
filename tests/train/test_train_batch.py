"""Data order and the one batch builder, with and without the feature cache."""

import torch
from train_helpers import EXAMPLES

from elfreg.text.load import load_frozen_text
from elfreg.train.batch import build_canvas, example_indices, make_batch
from elfreg.train.feature_cache import FeatureCache

CPU = torch.device("cpu")


def test_data_order_is_a_pure_function_of_seed_and_position():
    stream = example_indices(5, seed=3, start=0, count=23)
    for epoch in range(4):  # every epoch is a permutation of all examples
        assert sorted(stream[5 * epoch:5 * epoch + 5]) == list(range(5))
    assert stream[:5] != stream[5:10] or stream[5:10] != stream[10:15]  # epochs are reshuffled
    # Any slice of the stream, asked for on its own, is the same slice: nothing to save on resume.
    for start, count in [(0, 3), (3, 4), (4, 9), (17, 6)]:
        assert example_indices(5, seed=3, start=start, count=count) == stream[start:start + count]
    assert example_indices(5, seed=4, start=0, count=23) != stream


def _frozen(tiny_cfg):
    frozen = load_frozen_text(tiny_cfg().text, with_teacher=True)
    frozen.teacher.calibrate([build_canvas(frozen, EXAMPLES, [0, 1, 2, 3], CPU)])
    return frozen


def test_batch_rows_are_the_examples_features_in_order(tiny_cfg):
    frozen = _frozen(tiny_cfg)
    batch = make_batch(frozen, EXAMPLES, [3, 1], True, CPU)
    canvas = frozen.canvas.build([EXAMPLES[3].prompt, EXAMPLES[1].prompt], [EXAMPLES[3].answer, EXAMPLES[1].answer])
    assert torch.equal(batch.canvas.tokens, canvas.tokens)
    torch.testing.assert_close(batch.x, frozen.encoder.encode(canvas.tokens), rtol=0, atol=0)
    targets = frozen.teacher.targets(canvas)
    for name in ("repa", "reg", "reg_repa"):
        torch.testing.assert_close(getattr(batch.teacher, name), getattr(targets, name), rtol=0, atol=0)
    assert make_batch(frozen, EXAMPLES, [3, 1], False, CPU).teacher is None


def test_feature_cache_serves_the_features_make_batch_computes(tiny_cfg, monkeypatch):
    frozen = _frozen(tiny_cfg)
    cache = FeatureCache()
    first = make_batch(frozen, EXAMPLES, [2, 0, 2], True, CPU, cache)
    assert len(cache) == 2 and cache.missing([0, 1, 2, 3]) == [1, 3]
    calls = []
    monkeypatch.setattr(frozen.encoder, "encode", lambda *a: calls.append(a))
    monkeypatch.setattr(frozen.teacher, "targets", lambda *a: calls.append(a))
    second = make_batch(frozen, EXAMPLES, [0, 2], True, CPU, cache)  # all seen: no frozen forward
    assert calls == []
    monkeypatch.undo()
    fresh = make_batch(frozen, EXAMPLES, [0, 2], True, CPU)
    assert torch.equal(second.canvas.tokens, fresh.canvas.tokens)
    torch.testing.assert_close(second.x, fresh.x, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(first.x[0], first.x[2])
    for name in ("repa", "reg", "reg_repa"):
        torch.testing.assert_close(getattr(second.teacher, name), getattr(fresh.teacher, name), rtol=1e-5, atol=1e-5)


def test_feature_cache_runs_the_frozen_forward_on_unseen_rows_only(tiny_cfg, monkeypatch):
    frozen = _frozen(tiny_cfg)
    cache = FeatureCache()
    make_batch(frozen, EXAMPLES, [1, 3], False, CPU, cache)
    rows = []
    real = frozen.encoder.encode
    monkeypatch.setattr(frozen.encoder, "encode", lambda tokens: rows.append(tokens.shape[0]) or real(tokens))
    mixed = make_batch(frozen, EXAMPLES, [0, 1, 2, 3], False, CPU, cache)
    assert rows == [2] and len(cache) == 4 and mixed.teacher is None
    fresh = make_batch(frozen, EXAMPLES, [0, 1, 2, 3], False, CPU)
    torch.testing.assert_close(mixed.x, fresh.x, rtol=1e-5, atol=1e-5)
