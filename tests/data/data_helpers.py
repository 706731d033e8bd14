"""The paper recipes of ``configs/`` with their Hub sources replaced by the small fixture files
in ``fixtures/`` (the published schemas of OpenMathInstruct-2, MetaMathQA, OpenCodeInstruct and
an MMLU rationale file), so nothing is downloaded."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from elfreg.config import Config

FIXTURES = Path(__file__).resolve().parent / "fixtures"
CONFIGS = Path(__file__).resolve().parents[2] / "configs"
LOCAL = {"nvidia/OpenMathInstruct-2": "openmathinstruct2.jsonl", "meta-math/MetaMathQA": "metamathqa.jsonl",
         "nvidia/OpenCodeInstruct": "opencodeinstruct.jsonl",
         "data/mmlu-auxiliary-train-rationales.jsonl": "mmlu_rationales.jsonl"}
RECIPES = {"gsm8k": "elf-reg-b-gsm8k.yaml", "math": "elf-reg-l-math.yaml", "code": "elf-reg-l-code.yaml",
           "mmlu": "elf-reg-b-mmlu.yaml"}


def paper_config(recipe: str, overrides: list[str] | None = None) -> Config:
    """The shipped config of a paper recipe, reading the fixture files instead of the Hub."""
    cfg = Config.load(CONFIGS / RECIPES[recipe], overrides)
    sources = [dataclasses.replace(s, kind="jsonl", path=str(FIXTURES / LOCAL[s.path])) for s in cfg.data.sources]
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, sources=sources))
