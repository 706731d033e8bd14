"""The toy tokenizer: Hugging Face loadable, digits split, exact round trip, stable prompt boundary."""

from __future__ import annotations

import json
import re

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from elfreg.text.tokenizer import load_tokenizer
from elfreg.toy import corpus as TC
from elfreg.toy import tokenizer as TT


@pytest.fixture(scope="module")
def corpus() -> list[dict]:
    cfg = TC.ToyTaskConfig()
    held = TC.heldout_examples(cfg, "test")
    return TC.train_examples(cfg, 1500) + held["arith1"][:100] + held["arith2"][:100] + held["code"][:50]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory, corpus):
    folder = tmp_path_factory.mktemp("toy_tok")
    TT.save_tokenizer(TT.train_tokenizer(TC.lm_text(e) for e in corpus[:1500]), folder)
    return folder


def test_loads_with_auto_tokenizer(tok_dir) -> None:
    assert sorted(p.name for p in tok_dir.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    assert isinstance(tok, PreTrainedTokenizerFast)
    assert tok.eos_token == TC.EOS_TOKEN and tok.pad_token == TC.EOS_TOKEN
    assert tok.eos_token_id is not None and tok.pad_token_id == tok.eos_token_id
    assert tok.eos_token_id in tok.all_special_ids
    assert 300 <= len(tok) <= 2048
    assert json.loads((tok_dir / "tokenizer_config.json").read_text())["tokenizer_class"] == \
        "PreTrainedTokenizerFast"
    # No special token is added around plain text (as Qwen3: no BOS).
    assert tok("abc")["input_ids"] == tok("abc", add_special_tokens=False)["input_ids"]


def test_digits_are_single_tokens(tok_dir) -> None:
    tok = load_tokenizer(str(tok_dir))
    for piece in tok.get_vocab():
        if re.search(r"\d", piece):
            assert re.fullmatch(r"\d", piece), piece
    ids = tok("There are 12345 apples and 907 pears.")["input_ids"]
    pieces = [tok.decode([i]) for i in ids]
    assert [p for p in pieces if any(c.isdigit() for c in p)] == list("12345907")


def test_round_trip(tok_dir, corpus) -> None:
    tok = load_tokenizer(str(tok_dir))
    texts = [TC.lm_text(e) for e in corpus]
    texts += ["  odd   spacing\tand tabs\n\n", "Ünïcödé → 数字 42", "def f(x):\n    return [v*2 for v in x]"]
    for text, ids in zip(texts, tok(texts)["input_ids"], strict=True):
        assert tok.decode(ids) == text
    ids = tok(texts[0])["input_ids"] + [tok.eos_token_id]
    assert tok.decode(ids, skip_special_tokens=True) == texts[0]


def test_prompt_answer_boundary_is_stable(tok_dir, corpus) -> None:
    tok = load_tokenizer(str(tok_dir))
    joint = tok([TC.lm_text(e) for e in corpus])["input_ids"]
    prompts = tok([TC.lm_prompt(e) for e in corpus])["input_ids"]
    answers = tok([e["answer"] for e in corpus])["input_ids"]
    for ex, j, p, a in zip(corpus, joint, prompts, answers, strict=True):
        assert j == p + a, ex["prompt"]


def test_training_is_deterministic(corpus) -> None:
    texts = [TC.lm_text(e) for e in corpus[:500]]
    a = TT.train_tokenizer(texts).backend_tokenizer.to_str()
    b = TT.train_tokenizer(texts).backend_tokenizer.to_str()
    assert a == b
