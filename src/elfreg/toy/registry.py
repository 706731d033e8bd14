"""The toy tasks as training data and the ``toy:`` model ids of the CPU default.

A config may name the toy frozen models as ``toy:encoder`` / ``toy:teacher`` (the default toy
build) or ``toy-quick:encoder`` / ``toy-quick:teacher`` (the CI-sized build). They resolve to the
folders of :func:`~elfreg.toy.assets.build_toy_assets`, built on first use and cached, and
are then loaded with ``from_pretrained`` like any hub model.
"""

from __future__ import annotations

import sys

from elfreg.config import DataConfig
from elfreg.data.examples import Example
from elfreg.toy.corpus import lm_prompt


def resolve_toy_id(name: str) -> str:
    """``toy[-quick]:encoder|teacher|tokenizer`` → the local folder of the cached toy build. A
    first use builds it, saying so on stderr (what is built, each LM's steps every 30 s with the
    time left, the time it took), with progress bars only on a terminal: the id is resolved deep
    inside commands whose ``--no-progress`` cannot reach here, and a log should not fill with bars."""
    from elfreg.toy.assets import build_toy_assets

    scheme, _, part = name.partition(":")
    folders = {"encoder": "encoder_dir", "teacher": "teacher_dir", "tokenizer": "tokenizer_dir"}
    if part not in folders:
        raise ValueError(f"unknown toy model id {name!r}; use {scheme}:encoder, {scheme}:teacher or {scheme}:tokenizer")
    assets = build_toy_assets(quick=scheme == "toy-quick", progress=sys.stderr.isatty(),
                              say=lambda line: print(line, file=sys.stderr, flush=True))
    return str(getattr(assets, folders[part]))


def toy_prompt(question: str) -> str:
    """A toy question as the prompt a toy-trained student reads: ending in the separator the toy
    LMs were pretrained with, so the frozen encoder sees text exactly as in its pretraining (the
    ``elfreg.prompt_formats`` entry of the toy sources: sampling writes prompts as training did)."""
    return lm_prompt({"prompt": question})


def as_example(record: dict) -> Example:
    """A toy record as a (prompt, answer) pair, its prompt by :func:`toy_prompt`."""
    return Example(prompt=toy_prompt(record["prompt"]), answer=record["answer"])


def toy_records(cfg: DataConfig) -> list[dict]:
    """``cfg.toy_count`` training-split records of the toy task ``cfg.source`` names (chains with
    a share of one-step problems mixed in where ``cfg.toy_level1_share`` says)."""
    from elfreg.toy import arith as toy_arith
    from elfreg.toy import code as toy_code

    if cfg.source == "toy-arith":
        arith = toy_arith.ArithConfig(max_number=cfg.toy_max_number)
        if cfg.toy_level1_share:
            return toy_arith.sample_mixed(cfg.split, cfg.toy_count, cfg.toy_level1_share, seed=cfg.toy_seed,
                                          cfg=arith, balance=cfg.toy_balance)
        return toy_arith.sample(cfg.split, cfg.toy_level, cfg.toy_count, seed=cfg.toy_seed, cfg=arith,
                                balance=cfg.toy_balance)
    if cfg.source == "toy-code":
        return toy_code.sample(cfg.split, cfg.toy_count, seed=cfg.toy_seed)
    raise ValueError(f"not a toy data source: {cfg.source!r}")


def toy_examples(cfg: DataConfig) -> list[Example]:
    """:func:`toy_records` as (prompt, answer) examples."""
    return [as_example(r) for r in toy_records(cfg)]
