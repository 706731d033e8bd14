"""Data order and the one batch builder, with and without the feature cache."""

import torch
from train_helpers import EXAMPLES

from elfreg.text.load import load_frozen_text
from elfreg.train.batch import build_canvas, example_indices, make_batch, prompt_drops
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


def test_feature_cache_tokenises_each_example_once_into_the_same_canvas(tiny_cfg, monkeypatch):
    import elfreg.train.batch as batch_module

    frozen = _frozen(tiny_cfg)
    cache = FeatureCache()
    texts = []
    real = batch_module.token_ids
    monkeypatch.setattr(batch_module, "token_ids", lambda tok, batch: texts.append(len(batch)) or real(tok, batch))
    cached = [build_canvas(frozen, EXAMPLES, rows, CPU, cache) for rows in ([2, 0, 2], [0, 1, 2])]
    assert texts == [2, 2, 1, 1]  # prompts and answers of examples 2 and 0, then of example 1 alone
    for canvas, rows in zip(cached, ([2, 0, 2], [0, 1, 2]), strict=True):
        plain = build_canvas(frozen, EXAMPLES, rows, CPU)
        for name in ("tokens", "prompt_mask", "content_mask", "special_mask", "prompt_lens"):
            assert torch.equal(getattr(canvas, name), getattr(plain, name)), name


def test_feature_cache_runs_the_frozen_forward_on_unseen_rows_only(tiny_cfg, monkeypatch):
    frozen = _frozen(tiny_cfg)
    cache = FeatureCache()
    make_batch(frozen, EXAMPLES, [1, 3], False, CPU, cache)
    rows = []
    real = frozen.encoder.encode
    monkeypatch.setattr(frozen.encoder, "encode",
                        lambda tokens, mask=None: rows.append(tokens.shape[0]) or real(tokens, mask))
    mixed = make_batch(frozen, EXAMPLES, [0, 1, 2, 3], False, CPU, cache)
    assert rows == [2] and len(cache) == 4 and mixed.teacher is None
    fresh = make_batch(frozen, EXAMPLES, [0, 1, 2, 3], False, CPU)
    torch.testing.assert_close(mixed.x, fresh.x, rtol=1e-5, atol=1e-5)


def test_prompt_drops_are_a_rank_free_function_of_the_row_with_the_asked_rate():
    drops = prompt_drops(seed=1, micro=5, positions=range(4000), prob=0.1)
    assert 0.08 < sum(drops) / 4000 < 0.12
    assert prompt_drops(1, 5, [7, 8, 9], 0.1) == drops[7:10]  # a rank's share draws what one process draws
    assert prompt_drops(1, 6, range(4000), 0.1) != drops and not any(prompt_drops(1, 5, range(50), 0.0))


def test_a_dropped_prompt_is_zeros_and_its_answer_is_read_without_it(tiny_cfg):
    """ELF's label drop: the row's prompt positions hold zeros, its answer states and teacher targets
    are those of the answer read alone (the answer moved to the canvas start, then back)."""
    frozen = _frozen(tiny_cfg)
    batch = make_batch(frozen, EXAMPLES, [3, 1], True, CPU, dropped=[True, False])
    kept = make_batch(frozen, EXAMPLES, [3, 1], True, CPU)
    p = int(batch.canvas.prompt_lens[0])
    assert torch.all(batch.x[0, :p] == 0) and torch.all(batch.teacher.repa[0, :p] == 0)
    torch.testing.assert_close(batch.x[1], kept.x[1], rtol=0, atol=0)  # the other row is untouched
    answer = batch.canvas.tokens[0, p:]
    alone = frozen.encoder.encode(torch.cat([answer, answer.new_full((p,), frozen.tokenizer.eos_token_id)])[None])
    torch.testing.assert_close(batch.x[0, p:], alone[0, :-p], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(batch.x[0, p:], kept.x[0, p:], atol=1e-3)  # the prompt did matter
    assert not torch.allclose(batch.teacher.reg[0], kept.teacher.reg[0], atol=1e-3)
    # with the feature cache: the same features, and a dropped row is never stored
    cache = FeatureCache()
    cached = make_batch(frozen, EXAMPLES, [3, 1], True, CPU, cache, dropped=[True, False])
    assert cache.missing([3, 1]) == [0]
    torch.testing.assert_close(cached.x, batch.x, rtol=1e-5, atol=1e-5)
    for name in ("repa", "reg", "reg_repa"):
        torch.testing.assert_close(getattr(cached.teacher, name), getattr(batch.teacher, name), rtol=1e-5, atol=1e-5)
