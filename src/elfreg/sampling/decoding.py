"""From the decoder's argmax rows to answers (spec §1, §4): the first EOS ends the answer."""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase


def answer_token_ids(ids: torch.Tensor, eos_id: int) -> list[int]:
    """The answer of one decoded row: answer-region ids (prompt positions are −1) up to, not
    including, the first EOS."""
    answer = ids[ids >= 0].tolist()
    return answer[: answer.index(eos_id)] if eos_id in answer else answer


def answer_text(tokenizer: PreTrainedTokenizerBase, tokens: list[int]) -> str:
    """Token ids to text, special tokens skipped."""
    return tokenizer.decode(tokens, skip_special_tokens=True)
