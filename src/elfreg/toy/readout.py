"""How clearly a toy LM's layers name the digit a state stands on: the digit readout.

A student trained on a frozen encoder layer has to land its predicted state on the right digit,
and a wrong answer of a toy student is most often one digit off (docs/records/2026-12-04-toy-recipe.md).
The readout measures what the encoder gives it to work with: over the answer digits of
training-split problems, read each digit's state at one layer, standardise it per token (as
:class:`elfreg.text.frozen.FrozenEncoder` does for the student), and classify it by the nearest
class mean of the ten digits. The share classified right is the readout. Builds of the toy
encoder that differ only by seed or CPU kernels read 36-59 % at layer 2 with tied embeddings and
45-89 % untied (the default); a student trained on a build reading under 40 % failed (33 %
held-out pass@1 against 82 % on a 48 % build).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from elfreg.text.frozen import standardize_tokens
from elfreg.toy import arith
from elfreg.toy.lm import collate
from elfreg.toy.registry import as_example

READOUT_PROBLEMS = 600
"""Training-split one-step problems the build report's readout reads (sampling seed 3)."""


def readout_problems(count: int = READOUT_PROBLEMS, seed: int = 3, cfg: arith.ArithConfig | None = None
                     ) -> list[dict]:
    """``count`` one-step problems of the training split (``cfg``'s operands, default ones if None)."""
    return arith.sample("train", 1, count, seed=seed, cfg=cfg or arith.ArithConfig())


def digit_states(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, problems: Sequence[dict],
                 layers: Sequence[int], batch_size: int = 64) -> tuple[dict[int, torch.Tensor], torch.Tensor]:
    """The per-token standardised states (N, D) of every single-digit token of the problems'
    answers at each of ``layers`` (``hidden_states[k]``: the output of block k), and the digits
    (N,) they stand for. The LM reads ``prompt + answer`` as the student's canvas lays it out."""
    digit_of = {tokenizer.convert_tokens_to_ids(str(d)): d for d in range(10)}
    if len(digit_of) != 10 or any(i == tokenizer.unk_token_id for i in digit_of):
        raise ValueError("the digit readout needs a tokenizer with one token per digit 0-9")
    states: dict[int, list[torch.Tensor]] = {k: [] for k in layers}
    digits: list[int] = []
    examples = [as_example(p) for p in problems]
    model.eval()
    for i in range(0, len(examples), batch_size):
        chunk = examples[i : i + batch_size]
        prompts = tokenizer([e.prompt for e in chunk], add_special_tokens=False)["input_ids"]
        answers = tokenizer([e.answer for e in chunk], add_special_tokens=False)["input_ids"]
        rows = [p + a for p, a in zip(prompts, answers, strict=True)]
        ids, mask, _ = collate([(r, len(p)) for p, r in zip(prompts, rows, strict=True)], tokenizer.pad_token_id)
        with torch.no_grad():
            hidden = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
        picks = [(j, pos) for j, (p, r) in enumerate(zip(prompts, rows, strict=True))
                 for pos in range(len(p), len(r)) if r[pos] in digit_of]
        rows_idx = torch.tensor([j for j, _ in picks], dtype=torch.long)
        pos_idx = torch.tensor([pos for _, pos in picks], dtype=torch.long)
        for k in layers:
            states[k].append(standardize_tokens(hidden[k][rows_idx, pos_idx].float()))
        digits += [digit_of[rows[j][pos]] for j, pos in picks]
    return {k: torch.cat(v) for k, v in states.items()}, torch.tensor(digits, dtype=torch.long)


def nearest_class_mean_accuracy(states: torch.Tensor, labels: torch.Tensor) -> float:
    """Share of rows of ``states`` whose nearest class mean (Euclidean) is their own label's.
    Every label in ``0..labels.max()`` must occur."""
    classes = int(labels.max()) + 1
    counts = torch.bincount(labels, minlength=classes)
    if (counts == 0).any():
        raise ValueError(f"labels {torch.nonzero(counts == 0).flatten().tolist()} do not occur")
    means = torch.zeros(classes, states.shape[1]).index_add_(0, labels, states) / counts[:, None]
    return float((torch.cdist(states, means).argmin(1) == labels).float().mean())


def digit_readout(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, problems: Sequence[dict] | None = None,
                  layers: Sequence[int] | None = None) -> dict[int, float]:
    """The digit readout of each layer (default: every block's output, 1 … num_layers) over
    ``problems`` (default :func:`readout_problems`). An empty list of problems or of layers is
    refused: it would read nothing."""
    layers = list(range(1, model.config.num_hidden_layers + 1) if layers is None else layers)
    problems = readout_problems() if problems is None else problems
    if not problems or not layers:
        raise ValueError(f"the digit readout needs problems and layers, got {len(problems)} problems "
                         f"and {len(layers)} layers")
    states, digits = digit_states(model, tokenizer, problems, layers)
    return {k: round(nearest_class_mean_accuracy(states[k], digits), 4) for k in layers}
