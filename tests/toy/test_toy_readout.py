"""The digit readout: nearest-class-mean accuracy, which states it reads, and the build report."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from elfreg.toy import arith, readout
from elfreg.toy.registry import as_example
from elfreg.toy.report import READOUT_FLOOR, readout_lines
from elfreg.toy.tokenizer import train_tokenizer


def test_nearest_class_mean_on_known_clusters() -> None:
    gen = torch.Generator().manual_seed(0)
    centres = torch.randn(10, 16, generator=gen) * 10
    labels = torch.arange(10).repeat(20)
    tight = centres[labels] + 0.01 * torch.randn(200, 16, generator=gen)
    assert readout.nearest_class_mean_accuracy(tight, labels) == 1.0
    # Every state equal: every distance ties, argmin picks class 0, so exactly its share is right.
    same = torch.ones(200, 16)
    assert readout.nearest_class_mean_accuracy(same, labels) == pytest.approx(0.1)
    # Two of four states sit on the other class's mean: half right.
    two = torch.tensor([[0.0], [0.0], [10.0], [10.0]])
    assert readout.nearest_class_mean_accuracy(two, torch.tensor([0, 1, 1, 0])) == 0.5


def test_nearest_class_mean_refuses_a_missing_class() -> None:
    with pytest.raises(ValueError, match=r"\[1\] do not occur"):
        readout.nearest_class_mean_accuracy(torch.zeros(3, 2), torch.tensor([0, 2, 2]))


@pytest.fixture(scope="module")
def tiny_lm():
    problems = readout.readout_problems(40)
    texts = [as_example(p).prompt + as_example(p).answer for p in problems]
    tok = train_tokenizer(texts, 300)
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    return Qwen3ForCausalLM(cfg).eval(), tok, problems


def test_digit_states_are_the_answers_digits_standardised(tiny_lm) -> None:
    model, tok, problems = tiny_lm
    states, digits = readout.digit_states(model, tok, problems, layers=[1, 2], batch_size=7)
    expected = [int(c) for p in problems for c in as_example(p).answer if c.isdigit()]
    assert digits.tolist() == expected  # every answer digit, in order, one token each
    for k in (1, 2):
        assert states[k].shape == (len(expected), 32)
        assert torch.allclose(states[k].mean(1), torch.zeros(len(expected)), atol=1e-5)
        # unit variance up to the eps added to it (tiny states of a randomly initialised model)
        assert torch.allclose(states[k].var(1, unbiased=False), torch.ones(len(expected)), atol=1e-2)
    # Batching and padding do not change a state: one problem alone reads what it read in a batch.
    alone, _ = readout.digit_states(model, tok, problems[5:6], layers=[2])
    start = sum(c.isdigit() for p in problems[:5] for c in as_example(p).answer)
    assert torch.allclose(alone[2], states[2][start : start + len(alone[2])], atol=1e-5)


def test_digit_readout_keys_every_layer(tiny_lm) -> None:
    model, tok, problems = tiny_lm
    values = readout.digit_readout(model, tok, problems)
    assert set(values) == {1, 2} and all(0.0 <= v <= 1.0 for v in values.values())
    states, digits = readout.digit_states(model, tok, problems, layers=[1])
    assert values[1] == round(readout.nearest_class_mean_accuracy(states[1], digits), 4)
    assert set(readout.digit_readout(model, tok, problems, layers=[2])) == {2}


def test_digit_readout_refuses_empty_problems_or_layers(tiny_lm) -> None:
    model, tok, problems = tiny_lm
    with pytest.raises(ValueError, match="0 problems"):
        readout.digit_readout(model, tok, [])
    with pytest.raises(ValueError, match="0 layers"):
        readout.digit_readout(model, tok, problems, layers=[])


def test_readout_line_and_warning() -> None:
    def report(value):
        asset = {"encoder": {"digit_readout": {"2": value}}}  # report.json keys are strings
        return json.loads(json.dumps({"config": {"text": {"encoder_layer": 2}}, "asset_report": asset}))

    assert readout_lines(report(0.783)) == ["encoder digit readout at layer 2: 78.3%"]
    low = readout_lines(report(READOUT_FLOOR - 0.01))
    assert len(low) == 2 and low[1].startswith("warning: under 40%")


def test_readout_problems_follow_the_build_operands() -> None:
    problems = readout.readout_problems(50, cfg=arith.ArithConfig(max_number=20))
    operands = [int(n) for p in problems for n in p["key"].replace("-", "+").split("+")]
    assert max(operands) <= 20 and all(arith.split_of(p["key"]) == "train" for p in problems)
    assert len(problems) == 50 and all(p["level"] == 1 for p in problems)
