"""Which examples a micro-batch holds, which of them are this rank's, and the batch the
objective trains on.

The data order is a pure function of (seed, position in an endless stream of epochs), so a run
needs no saved sampler state to continue exactly where it stopped. Micro-batch k is positions
[k·B, (k+1)·B) of that stream (B = ``train.batch_size``, the *global* micro-batch); rank r of N
takes its share (:func:`rank_share`), and the objective's random draws for each row are a
function of (seed, k, the row's position in the global micro-batch) (:func:`row_draws`), never
of the rank, so N ranks compute what one process does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import lru_cache

import torch

from ..data.examples import Example
from ..data.shards import ShardedExamples
from ..flow.noising import RowDraws
from ..flow.objective import TrainBatch
from ..text.canvas import Canvas, back_to_canvas, token_ids
from ..text.frozen import TeacherTargets
from ..text.load import FrozenText
from .feature_cache import FeatureCache

TrainingData = list[Example] | ShardedExamples
"""Examples in memory (texts) or prepared shards (token ids); both are indexed by example."""


@lru_cache(maxsize=2)
def _epoch_order(n_examples: int, seed: int, epoch: int) -> torch.Tensor:
    return torch.randperm(n_examples, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))


def example_indices(n_examples: int, seed: int, start: int, count: int) -> list[int]:
    """Positions [start, start+count) of an endless stream of per-epoch random permutations
    (the permutation of the current epoch is computed once, not per micro-batch)."""
    out = []
    while len(out) < count:
        pos = start + len(out)
        epoch, offset = divmod(pos, n_examples)
        perm = _epoch_order(n_examples, seed, epoch)
        take = min(count - len(out), n_examples - offset)
        out.extend(perm[offset:offset + take].tolist())
    return out


def rank_share(positions: Sequence[int], rank: int, world: int) -> list[int]:
    """Rank ``rank``'s share of the global micro-batch ``positions``: the ``rank``-th of ``world``
    equal contiguous parts (the one place a batch is split over ranks)."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not in [0, {world})")
    if len(positions) % world:
        raise ValueError(f"a global micro-batch of {len(positions)} examples cannot be split over {world} ranks")
    per = len(positions) // world
    return list(positions[rank * per:(rank + 1) * per])


def row_seed(seed: int, micro: int, position: int) -> int:
    """The seed of the objective's draws for the row at ``position`` of global micro-batch
    ``micro``: a hash of the three numbers (64 bits)."""
    digest = hashlib.blake2b(f"elfreg-row:{seed}:{micro}:{position}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def prompt_drops(seed: int, micro: int, positions: Sequence[int], prob: float) -> list[bool]:
    """Which rows of global micro-batch ``micro`` have their prompt dropped (``flow.prompt_drop``,
    ELF's label drop): each with probability ``prob``, from a hash of (seed, micro-batch, position)
    apart from the objective's draws, so every rank count drops the same rows."""
    if prob <= 0:
        return [False] * len(positions)
    drops = []
    for p in positions:
        digest = hashlib.blake2b(f"elfreg-prompt-drop:{seed}:{micro}:{p}".encode(), digest_size=8).digest()
        drops.append(int.from_bytes(digest, "little") / 2**64 < prob)
    return drops


def row_draws(seed: int, micro: int, positions: Sequence[int], device: torch.device | str) -> RowDraws:
    """One generator per row, seeded by :func:`row_seed` (``positions`` are the rows' places in
    the global micro-batch, 0 … B−1), on ``device``."""
    return RowDraws([torch.Generator(device=device).manual_seed(row_seed(seed, micro, p)) for p in positions])


def build_canvas(frozen: FrozenText, examples: TrainingData, indices: list[int], device: torch.device,
                 cache: FeatureCache | None = None) -> Canvas:
    """The canvas (ELF-REG §3, App. A.1) of ``examples[i]`` for ``i`` in ``indices``, on ``device``: texts
    are tokenised here (once per example with a ``cache``, which keeps the ids), prepared shards
    (:class:`~elfreg.data.shards.ShardedExamples`) come as token ids."""
    builder = frozen.canvas
    if isinstance(examples, ShardedExamples):
        chosen = [examples[i] for i in indices]
        return builder.build_ids([e.prompt for e in chosen], [e.answer for e in chosen]).to(device)
    if cache is None:
        chosen = [examples[i] for i in indices]
        return builder.build([e.prompt for e in chosen], [e.answer for e in chosen]).to(device)

    def tokenize(new: list[int]) -> tuple[list[list[int]], list[list[int]]]:
        return (token_ids(builder.tokenizer, [examples[i].prompt for i in new]),
                token_ids(builder.tokenizer, [examples[i].answer for i in new]))

    return builder.build_ids(*cache.token_ids(indices, tokenize)).to(device)


def frozen_features(frozen: FrozenText, canvas: Canvas, with_teacher: bool, dropped: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor, TeacherTargets | None]:
    """Clean encoder states x (arXiv 2609.29102 §3.1) and, ``with_teacher``, the teacher's
    REPA/REG targets (§3.2-3.3). Rows in ``dropped`` (bool, B) are read without their prompt
    (:meth:`~elfreg.text.canvas.Canvas.without_prompt`): their answer states and targets do not
    see it, and their prompt positions hold zeros (ELF's label drop zeroes the prompt's states)."""
    x = frozen.encoder.encode_canvas(canvas)
    teacher = frozen.teacher.targets(canvas) if with_teacher else None
    if dropped is None or not bool(dropped.any()):
        return x, teacher
    rows = dropped.nonzero().squeeze(1)
    part = canvas.select(rows)
    alone = part.without_prompt(frozen.tokenizer.eos_token_id)
    x[rows] = back_to_canvas(frozen.encoder.encode_canvas(alone), part.prompt_lens)
    if teacher is not None:
        t = frozen.teacher.targets(alone)
        teacher.repa[rows] = back_to_canvas(t.repa, part.prompt_lens)
        teacher.reg[rows], teacher.reg_repa[rows] = t.reg, t.reg_repa
    return x, teacher


def make_batch(frozen: FrozenText, examples: TrainingData, indices: list[int], with_teacher: bool,
               device: torch.device, cache: FeatureCache | None = None,
               dropped: Sequence[bool] | None = None) -> TrainBatch:
    """The training batch of ``examples[i]`` for ``i`` in ``indices``: canvas and frozen features,
    the rows flagged in ``dropped`` without their prompt (:func:`frozen_features`).

    Without a ``cache`` every row runs the frozen forwards. With one, only rows of examples it
    has not seen do; their features are stored and every row's are read back from it, so a batch
    of seen examples makes no frozen forward at all. Rows without their prompt are read afresh
    and never stored (their features are not the example's).
    """
    canvas = build_canvas(frozen, examples, indices, device, cache)
    drop = [bool(d) for d in dropped] if dropped is not None else [False] * len(indices)
    if cache is None:
        x, teacher = frozen_features(frozen, canvas, with_teacher, torch.tensor(drop, device=device))
        return TrainBatch(canvas=canvas, x=x, teacher=teacher)
    kept = [j for j, d in enumerate(drop) if not d]
    missing = [kept[j] for j in cache.missing([indices[j] for j in kept])]
    if missing:
        rows = canvas.select(torch.tensor(missing, device=device))
        cache.store([indices[j] for j in missing], *frozen_features(frozen, rows, with_teacher))
    pieces = [(kept, *cache.gather([indices[j] for j in kept], with_teacher))] if kept else []
    if len(kept) < len(indices):
        alone = [j for j, d in enumerate(drop) if d]
        rows = torch.tensor(alone, device=device)
        pieces.append((alone, *frozen_features(frozen, canvas.select(rows), with_teacher, torch.ones_like(rows) > 0)))
    x, teacher = _in_row_order(len(indices), pieces)
    return TrainBatch(canvas=canvas, x=x, teacher=teacher)


def _in_row_order(n: int, pieces: list[tuple[list[int], torch.Tensor, TeacherTargets | None]]
                  ) -> tuple[torch.Tensor, TeacherTargets | None]:
    """Features of a batch of ``n`` rows from pieces (rows, x, teacher targets) that cover it."""
    def place(parts: list[torch.Tensor]) -> torch.Tensor:
        whole = parts[0].new_empty(n, *parts[0].shape[1:])
        for (rows, *_), part in zip(pieces, parts, strict=True):
            whole[torch.tensor(rows, device=whole.device)] = part
        return whole

    x = place([p[1] for p in pieces])
    if pieces[0][2] is None:
        return x, None
    return x, TeacherTargets(*(place([getattr(p[2], name) for p in pieces]) for name in ("repa", "reg", "reg_repa")))
