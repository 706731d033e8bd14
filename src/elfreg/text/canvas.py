"""The canvas: prompt | answer | EOS padding, as one fixed-length token row per example (ELF-REG §3, App. A.1).

Overflow policy (counted in :class:`CanvasStats`):
- a prompt longer than ``prompt_cap`` keeps its last ``prompt_cap`` tokens (``prompt_truncation:
  left``, the default: the question is at its end in every template elfreg ships) or its first
  (``right``: ELF's conditional tasks, which keep the start of a document to summarise or a
  sentence to translate);
- an answer longer than the room left keeps its first tokens and gets no EOS; such examples are
  counted so a data pipeline can drop them or grow the canvas.
The answer may use every position after the actual prompt, so examples with short prompts get
longer answer regions. A prompt may be empty: an unconditional model's canvas (ELF's OpenWebText
models) is all answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase


@dataclass
class CanvasStats:
    examples: int = 0
    prompts_truncated: int = 0
    answers_truncated: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"examples": self.examples, "prompts_truncated": self.prompts_truncated,
                "answers_truncated": self.answers_truncated}


@dataclass
class Canvas:
    """Token rows and position masks, all of shape (B, L)."""

    tokens: torch.Tensor  # long; EOS fills the answer region after the content
    prompt_mask: torch.Tensor  # prompt positions: kept clean, never supervised
    content_mask: torch.Tensor  # answer tokens that are not special tokens (REPA positions)
    special_mask: torch.Tensor  # positions holding a special token (EOS padding included)
    prompt_lens: torch.Tensor  # (B,) long
    lengths: torch.Tensor  # (B,) long: prompt + answer tokens on the canvas; the EOS padding follows

    @property
    def answer_mask(self) -> torch.Tensor:
        """Supervised positions: every position after the prompt, EOS padding included."""
        return ~self.prompt_mask

    @property
    def last_content(self) -> torch.Tensor:
        """(B,) index of the last non-special token of prompt + answer (the REG position)."""
        pos = torch.arange(self.tokens.shape[1], device=self.tokens.device)
        return torch.where(~self.special_mask, pos, -1).amax(dim=1).clamp(min=0)

    def _fields(self) -> tuple[torch.Tensor, ...]:
        return self.tokens, self.prompt_mask, self.content_mask, self.special_mask, self.prompt_lens, self.lengths

    def to(self, device: torch.device | str) -> Canvas:
        return Canvas(*(t.to(device) for t in self._fields()))

    def select(self, rows: torch.Tensor) -> Canvas:
        """The canvas of the given batch rows."""
        return Canvas(*(t[rows] for t in self._fields()))

    def without_prompt(self, eos_id: int) -> Canvas:
        """Each row's answer region moved to position 0, its prompt removed and EOS padding after:
        what the frozen models read for an example whose prompt is dropped in training (ELF's
        label drop, ``flow.prompt_drop``). :func:`back_to_canvas` puts their states back in place."""
        length = self.tokens.shape[1]
        source = torch.arange(length, device=self.tokens.device)[None, :] + self.prompt_lens[:, None]
        inside = source < length
        source = source.clamp(max=length - 1)
        tokens = torch.where(inside, self.tokens.gather(1, source), eos_id)
        special = torch.where(inside, self.special_mask.gather(1, source), True)
        content = torch.where(inside, self.content_mask.gather(1, source), False)
        none = torch.zeros_like(self.prompt_mask)
        return Canvas(tokens, none, content, special, torch.zeros_like(self.prompt_lens),
                      self.lengths - self.prompt_lens)


@dataclass
class CanvasBuilder:
    tokenizer: PreTrainedTokenizerBase
    canvas_len: int
    prompt_cap: int
    prompt_truncation: Literal["left", "right"] = "left"  # a long prompt loses its start (left) or its end
    answer_cap: int = 0  # answers are read from at most this many tokens of the answer region (0: all of it)
    stats: CanvasStats = field(default_factory=CanvasStats)

    def __post_init__(self) -> None:
        if not 1 <= self.prompt_cap < self.canvas_len:
            raise ValueError(f"prompt_cap must be in [1, canvas_len); got {self.prompt_cap}, {self.canvas_len}")
        if self.prompt_truncation not in ("left", "right"):
            raise ValueError(f"prompt_truncation must be left or right; got {self.prompt_truncation!r}")
        if self.answer_cap < 0:
            raise ValueError(f"answer_cap must be >= 0 (0: the whole answer region); got {self.answer_cap}")
        self._special = torch.tensor(sorted(set(self.tokenizer.all_special_ids)), dtype=torch.long)

    def build(self, prompts: list[str], answers: list[str] | None = None) -> Canvas:
        """Lay out prompts (and answers, for training) on canvases of ``canvas_len`` tokens.

        Without answers the answer region holds EOS placeholders (inference).
        """
        if answers is not None and len(answers) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(answers)} answers")
        return self.build_ids(token_ids(self.tokenizer, prompts),
                              None if answers is None else token_ids(self.tokenizer, answers))

    def build_ids(self, prompts: Sequence[Sequence[int]], answers: Sequence[Sequence[int]] | None = None) -> Canvas:
        """:meth:`build` for texts already tokenised (``token_ids``; e.g. read from data shards)."""
        if answers is not None and len(answers) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(answers)} answers")
        eos = self.tokenizer.eos_token_id
        rows, lens, lengths = [], [], []
        for i, prompt in enumerate(prompts):
            ans = [] if answers is None else answers[i]
            p_keep, a_keep, _ = (int(v) for v in fit_lengths(len(prompt), len(ans), self.canvas_len, self.prompt_cap))
            self.stats.prompts_truncated += int(p_keep < len(prompt))
            self.stats.answers_truncated += int(a_keep >= self.canvas_len - p_keep)
            kept = prompt[len(prompt) - p_keep:] if self.prompt_truncation == "left" else prompt[:p_keep]
            ids = list(kept) + list(ans[:a_keep])
            rows.append(ids + [eos] * (self.canvas_len - len(ids)))
            lens.append(p_keep)
            lengths.append(len(ids))
            self.stats.examples += 1
        tokens = torch.tensor(rows, dtype=torch.long)
        prompt_lens = torch.tensor(lens, dtype=torch.long)
        pos = torch.arange(self.canvas_len)
        prompt_mask = pos[None, :] < prompt_lens[:, None]
        special_mask = torch.isin(tokens, self._special)
        content_mask = ~prompt_mask & ~special_mask
        return Canvas(tokens, prompt_mask, content_mask, special_mask, prompt_lens,
                      torch.tensor(lengths, dtype=torch.long))


def back_to_canvas(values: torch.Tensor, prompt_lens: torch.Tensor) -> torch.Tensor:
    """Per-position values (B, L, …) read on :meth:`Canvas.without_prompt` canvases, moved back to
    the original positions (the answer after its prompt); prompt positions hold zeros."""
    length = values.shape[1]
    pos = torch.arange(length, device=values.device)[None, :]
    source = pos - prompt_lens.to(values.device)[:, None]
    inside = source >= 0
    index = source.clamp(min=0).reshape(*source.shape, *([1] * (values.dim() - 2))).expand_as(values)
    moved = values.gather(1, index)
    return torch.where(inside.reshape(*inside.shape, *([1] * (values.dim() - 2))), moved, torch.zeros_like(moved))


def token_ids(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str]) -> list[list[int]]:
    """The token ids of each text, without special tokens (one batched call, which gives each
    text the ids it gets alone): how the canvas and the data shards tokenise."""
    return tokenizer(list(texts), add_special_tokens=False)["input_ids"] if len(texts) else []


def fit_lengths(prompt_len, answer_len, canvas_len: int, prompt_cap: int):
    """The overflow policy as lengths: (prompt tokens kept, answer tokens kept, whether the EOS
    after the answer is on the canvas). Works on ints and on numpy arrays of lengths alike, so
    the canvas and the token accounting of prepared data (:mod:`elfreg.data.prepare`) share it."""
    kept_prompt = np.minimum(prompt_len, prompt_cap)
    room = canvas_len - kept_prompt
    kept_answer = np.minimum(answer_len, room)
    return kept_prompt, kept_answer, answer_len < room
