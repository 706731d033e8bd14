"""Extension points through which rooms outside the method's core plug into it.

The core rooms never import the toy room (or any other harness). Instead, a package registers
what it provides as Python entry points in its ``pyproject.toml``, and the core looks them up by
name when a config asks for them:

- ``elfreg.model_schemes``: a model-id scheme (``scheme:part``, e.g. ``toy:encoder``) → a function
  ``(model_id) -> local folder``; :func:`resolve_model_id` applies it to any id whose prefix is a
  registered scheme and leaves hub ids and paths as they are.
- ``elfreg.data_sources``: a ``data.source`` name (e.g. ``toy-arith``) → a function
  ``(DataConfig) -> list[Example]``.
- ``elfreg.prompt_formats``: a ``data.source`` name → a function ``(question) -> prompt``: how
  that source's loader wrote its prompts, for a source that formats them itself (the toy tasks
  end each prompt with the newline their LMs were pretrained with) rather than through
  ``data.template``; :func:`elfreg.text.templates.prompt_for` applies it at sampling time.

elfreg registers its own toy room this way, so ``pip install -e .`` (or any install) is what
makes ``toy:`` ids and the toy data sources available.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from importlib.metadata import entry_points
from typing import Any

MODEL_SCHEMES = "elfreg.model_schemes"
DATA_SOURCES = "elfreg.data_sources"
PROMPT_FORMATS = "elfreg.prompt_formats"


@cache
def _registered(group: str) -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=group)}


def registered_names(group: str) -> list[str]:
    """Names registered in ``group`` by the installed packages."""
    return sorted(_registered(group))


def lookup(group: str, name: str) -> Callable[..., Any] | None:
    """The function registered as ``name`` in ``group``, or None."""
    ep = _registered(group).get(name)
    return None if ep is None else ep.load()


def model_scheme(model_id: str | None) -> str | None:
    """The registered scheme ``model_id`` starts with (``toy`` for ``toy:encoder``), or None."""
    if not model_id or ":" not in model_id:
        return None
    scheme = model_id.split(":", 1)[0]
    return scheme if scheme in _registered(MODEL_SCHEMES) else None


def resolve_model_id(model_id: str | None) -> str | None:
    """A model id with a registered scheme resolved to its local folder; others unchanged."""
    scheme = model_scheme(model_id)
    if scheme is None:
        return model_id
    return str(lookup(MODEL_SCHEMES, scheme)(model_id))
