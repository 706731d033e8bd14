"""A small byte-level BPE tokenizer trained on the toy corpus, saved in Hugging Face format.

Choice: byte-level BPE (as GPT-2 / Qwen), not WordLevel, so that *any* text encodes without an
unknown token (the student may decode arbitrary strings, and code prompts contain arbitrary
identifiers) and ``decode(encode(s)) == s`` holds exactly. A ``Digits(individual_digits=True)``
pre-tokenizer runs first, so every digit is its own token and no merge ever joins two digits.
The only special token is ``<|endoftext|>``: EOS and padding (as in Qwen3; there is no BOS).

The saved folder holds ``tokenizer.json`` + ``tokenizer_config.json`` and loads with
``transformers.AutoTokenizer.from_pretrained(folder)``, as :func:`elfreg.text.tokenizer.load_tokenizer` does
for every tokenizer.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from elfreg.toy.corpus import EOS_TOKEN

DEFAULT_VOCAB_SIZE = 1024
MODEL_MAX_LENGTH = 512


def train_tokenizer(texts: Iterable[str], vocab_size: int = DEFAULT_VOCAB_SIZE) -> PreTrainedTokenizerFast:
    """Train the toy BPE on ``texts`` and wrap it as a ``PreTrainedTokenizerFast``.

    The vocabulary is at most ``vocab_size`` (256 byte symbols + EOS + merges seen at least
    twice); training is deterministic for a given text sequence.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=EOS_TOKEN,
        model_max_length=MODEL_MAX_LENGTH, clean_up_tokenization_spaces=False, padding_side="right",
    )


def save_tokenizer(tokenizer: PreTrainedTokenizerBase, folder: str | os.PathLike) -> Path:
    """Save in Hugging Face format (``tokenizer.json`` + ``tokenizer_config.json``)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(folder)
    # Name the generic fast class so that both transformers 4.x and 5.x resolve it.
    cfg_path = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    return folder
