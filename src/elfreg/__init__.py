"""ELF-REG: continuous flow-matching diffusion language models."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

if TYPE_CHECKING:
    from .serve.model import Model


def load(path_or_hub_id: Any, revision: str | None = None, device: str = "auto", precision: str = "auto",
         use_ema: bool = True) -> Model:
    """A trained model, ready to ``generate`` (:func:`elfreg.serve.model.load`; docs/sampling.md).
    Imported on first use, so ``import elfreg`` stays light."""
    from .serve.model import load as _load

    return _load(path_or_hub_id, revision, device, precision, use_ema)
