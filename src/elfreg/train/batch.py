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


def row_draws(seed: int, micro: int, positions: Sequence[int], device: torch.device | str) -> RowDraws:
    """One generator per row, seeded by :func:`row_seed` (``positions`` are the rows' places in
    the global micro-batch, 0 … B−1), on ``device``."""
    return RowDraws([torch.Generator(device=device).manual_seed(row_seed(seed, micro, p)) for p in positions])


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
