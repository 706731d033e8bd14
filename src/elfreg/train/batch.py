"""Which examples a micro-batch holds, and the batch the objective trains on.

The data order is a pure function of (seed, position in an endless stream of epochs), so a run
needs no saved sampler state to continue exactly where it stopped.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from ..data.examples import Example
from ..data.shards import ShardedExamples
from ..flow.objective import TrainBatch
from ..text.canvas import Canvas
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


def build_canvas(frozen: FrozenText, examples: TrainingData, indices: list[int], device: torch.device) -> Canvas:
    """The canvas (spec §2) of ``examples[i]`` for ``i`` in ``indices``, on ``device``: texts
    are tokenised here, prepared shards (:class:`~elfreg.data.shards.ShardedExamples`) come
    as token ids."""
    chosen = [examples[i] for i in indices]
    if isinstance(examples, ShardedExamples):
        return frozen.canvas.build_ids([e.prompt for e in chosen], [e.answer for e in chosen]).to(device)
    return frozen.canvas.build([e.prompt for e in chosen], [e.answer for e in chosen]).to(device)


def frozen_features(frozen: FrozenText, canvas: Canvas, with_teacher: bool
                    ) -> tuple[torch.Tensor, TeacherTargets | None]:
    """Clean encoder states x (spec §2) and, ``with_teacher``, the teacher's REPA/REG targets (§3)."""
    x = frozen.encoder.encode(canvas.tokens)
    return x, frozen.teacher.targets(canvas) if with_teacher else None


def make_batch(frozen: FrozenText, examples: TrainingData, indices: list[int], with_teacher: bool,
               device: torch.device, cache: FeatureCache | None = None) -> TrainBatch:
    """The training batch of ``examples[i]`` for ``i`` in ``indices``: canvas and frozen features.

    Without a ``cache`` every row runs the frozen forwards. With one, only rows of examples it
    has not seen do; their features are stored and every row's are read back from it, so a batch
    of seen examples makes no frozen forward at all.
    """
    canvas = build_canvas(frozen, examples, indices, device)
    if cache is None:
        x, teacher = frozen_features(frozen, canvas, with_teacher)
        return TrainBatch(canvas=canvas, x=x, teacher=teacher)
    missing = cache.missing(indices)
    if missing:
        rows = canvas.select(torch.tensor(missing, device=device))
        cache.store([indices[j] for j in missing], *frozen_features(frozen, rows, with_teacher))
    x, teacher = cache.gather(indices, with_teacher)
    return TrainBatch(canvas=canvas, x=x, teacher=teacher)
