"""The toy corpus: which toy examples the tiny LMs see, and the one text format they see them in.

Text format (shared by tokenizer training, LM pretraining, greedy decoding and anything else
that shows a toy example to an autoregressive LM)::

    prompt + SEP + answer + EOS        with SEP = "\\n"

``lm_prompt(ex)`` is ``prompt + SEP``: the text an LM continues to produce the answer. The prompt
of every toy example is a single line and every answer starts with a non-space character, so
the token boundary after ``SEP`` is stable: tokens(prompt + SEP) followed by tokens(answer) are
exactly the tokens of the joined text (tested).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field

from elfreg.toy import arith as toy_arith
from elfreg.toy import code as toy_code

SEP = "\n"
"""Separator between prompt and answer in LM text."""
EOS_TOKEN = "<|endoftext|>"
"""End-of-text token of the toy tokenizer; also the padding token (as in Qwen3)."""


@dataclass(frozen=True)
class ToyTaskConfig:
    """Which toy tasks make up the LM corpus, and in which proportions (part of the cache key)."""

    arith: toy_arith.ArithConfig = field(default_factory=toy_arith.ArithConfig)
    weight_arith1: float = 0.4
    """Share of level-1 arith problems in the pretraining corpus."""
    weight_arith2: float = 0.4
    """Share of level-2 arith problems."""
    weight_code: float = 0.2
    """Share of code problems (0 drops the code task from the LMs' corpus)."""
    seed: int = 0

    def __post_init__(self) -> None:
        weights = (self.weight_arith1, self.weight_arith2, self.weight_code)
        if min(weights) < 0 or sum(weights) <= 0:
            raise ValueError(f"corpus weights must be non-negative with a positive sum, got {weights}")

    def to_dict(self) -> dict:
        """Plain-data form (for hashing and for the settings file beside built assets)."""
        return asdict(self)


def lm_prompt(example: dict) -> str:
    """The text an LM continues to answer ``example``: ``prompt + SEP``."""
    return example["prompt"] + SEP


def lm_text(example: dict) -> str:
    """The training text of ``example`` without EOS: ``prompt + SEP + answer``."""
    return example["prompt"] + SEP + example["answer"]


def train_examples(cfg: ToyTaskConfig, n: int, seed: int | None = None) -> list[dict]:
    """``n`` train-split examples mixed by the config weights, shuffled (deterministic per seed)."""
    seed = cfg.seed if seed is None else seed
    weights = (cfg.weight_arith1, cfg.weight_arith2, cfg.weight_code)
    total = sum(weights)
    counts = [int(round(n * w / total)) for w in weights]
    counts[0] += n - sum(counts)
    out = (toy_arith.sample("train", 1, counts[0], seed=seed, cfg=cfg.arith)
           + toy_arith.sample("train", 2, counts[1], seed=seed, cfg=cfg.arith)
           + toy_code.sample("train", counts[2], seed=seed))
    random.Random(f"toy-corpus|{seed}").shuffle(out)
    return out


def heldout_examples(cfg: ToyTaskConfig, split: str = "test") -> dict[str, list[dict]]:
    """The fixed held-out sets by name: ``arith1``, ``arith2`` and ``code``."""
    return {"arith1": toy_arith.heldout(split, 1, cfg.arith, seed=cfg.seed),
            "arith2": toy_arith.heldout(split, 2, cfg.arith, seed=cfg.seed),
            "code": toy_code.heldout(split, seed=cfg.seed)}
