"""``elfreg.load``: a trained model in Python, from a folder or the Hugging Face Hub.

    import elfreg
    model = elfreg.load("runs/demo/elf-reg")              # a run, checkpoint or release folder
    model = elfreg.load("owner/name", revision="v1")     # a release on the Hub (elfreg export)
    model.generate([model.prompt("What is 2 + 3?")], nfe=16)  # -> ["2 + 3 = 5 ..."], one text a prompt
    model.sample([model.prompt("What is 2 + 3?")], samples=4, record_every=4)  # GenerationResult, trajectories

Contract:

- ``path_or_hub_id`` is a local folder when one exists at that path (your own runs, loaded as
  they are); otherwise an ``owner/name`` id of a release (``elfreg export``'s folder), of which
  only files that cannot run code are fetched and read (:mod:`elfreg.serve.hub`: a training
  checkpoint from a download, or a snapshot holding a pickle, is refused in one line).
  :attr:`Model.source` records where the weights came from: the folder, and for the Hub the id,
  the revision asked for, the commit it resolved to and the sha256 of every file;
- sampler settings are :class:`~elfreg.config.SampleConfig`'s fields, given as keyword
  arguments; what is not given is the checkpoint's own setting (:attr:`Model.settings`); an
  unknown or invalid setting is a one-line :class:`~elfreg.config.ConfigError`;
- :meth:`Model.generate` and :meth:`Model.sample` are :func:`elfreg.sampling.generate` on the
  loaded checkpoint: the same texts for the same seed and settings. They take whole prompts, as
  the model read them in training; :meth:`Model.prompt` writes one from a question the way the
  checkpoint's training data did (its template, or its data source's own format).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import SampleConfig
from ..sampling import GenerationResult, SamplingModels, generate, load_checkpoint
from ..text.templates import prompt_for
from .hub import fetch_release


def resolve_source(path_or_hub_id: str | os.PathLike, revision: str | None = None) -> tuple[Path, dict[str, Any]]:
    """The local folder of ``path_or_hub_id`` and the record of where it came from.

    Raises:
        FileNotFoundError: neither a local path nor an ``owner/name`` Hub id.
        UnsafeDownload: a Hub snapshot that is not a release, or that holds a pickle.
    """
    local = Path(path_or_hub_id).expanduser()
    if local.exists():
        if revision is not None:
            raise ValueError(f"revision={revision!r} is for Hub ids; {local} is a local folder")
        return local, {"kind": "local", "path": str(local.resolve())}
    name = str(path_or_hub_id)
    if name.count("/") != 1 or name.startswith((".", "/")) or not all(name.split("/")):
        raise FileNotFoundError(f"no checkpoint at {name} (not a folder here, nor an owner/name Hub id)")
    return fetch_release(name, revision)


@dataclass
class Model:
    """A loaded checkpoint ready to sample (:func:`load`)."""

    models: SamplingModels
    source: dict[str, Any] = field(default_factory=dict)

    @property
    def settings(self) -> SampleConfig:
        """The checkpoint's own sampler settings: what a call does not set."""
        return self.models.config.sample

    def settings_with(self, **changes: Any) -> SampleConfig:
        """:attr:`settings` with ``changes`` (SampleConfig's fields), validated."""
        return self.settings.replace(**changes).validate()

    def prompt(self, question: str) -> str:
        """The whole prompt this checkpoint reads for ``question``, written as its training prompts
        were (:func:`elfreg.text.templates.prompt_for`: the toy tasks add the newline their LMs
        end a prompt with, GSM8K's template its boxed-answer instruction)."""
        return prompt_for(self.models.config.data, question)

    def sample(self, prompts: str | list[str], *, samples: int = 1, seed: int = 0, batch_size: int = 8,
               record_every: int = 0, progress: bool = False, **settings: Any) -> list[GenerationResult]:
        """Every (prompt, sample) result, prompt-major, sample j with seed ``seed + j``; with
        ``record_every`` > 0 each carries its trajectory."""
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        return generate(self.models, prompts, self.settings_with(**settings), samples=samples, seed=seed,
                        batch_size=batch_size, record_every=record_every, progress=progress)

    def generate(self, prompts: str | list[str], *, samples: int = 1, seed: int = 0, batch_size: int = 8,
                 progress: bool = False, **settings: Any) -> list[str]:
        """The answer texts: one per (prompt, sample), prompt-major."""
        return [r.text for r in self.sample(prompts, samples=samples, seed=seed, batch_size=batch_size,
                                            progress=progress, **settings)]


def load(path_or_hub_id: str | os.PathLike, revision: str | None = None, device: str = "auto",
         precision: str = "auto", use_ema: bool = True) -> Model:
    """Load a trained elfreg model (module docstring): a run folder, a checkpoint, a release
    (``elfreg export``) or a Hub id of a release."""
    folder, source = resolve_source(path_or_hub_id, revision)
    models = load_checkpoint(folder, device, precision, use_ema=use_ema)
    return Model(models, {**source, "checkpoint": str(models.checkpoint), "weights": "ema" if use_ema else "raw"})
