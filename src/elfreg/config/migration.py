"""Run configs of earlier elfreg versions: the keys that moved, and the one migration that reads them.

Every config is built through :func:`migrate` (:meth:`elfreg.config.Config.from_dict`, so a
YAML file, a run folder's or checkpoint's ``config.yaml``, a study plan's resolved model), and
``section.key=value`` overrides and study plans name a moved key by either name
(:func:`migrated_key`). What moved:

- ``loss.repa`` → ``model.repa`` and ``loss.extra_token`` → ``model.extra_token``: the REPA
  projector and the extra token are parts of the student's shape, not of its loss.

A config that gives a key at both places, with two values, is refused in one line.
"""

from __future__ import annotations

from typing import Any

from .strict import ConfigError

__all__ = ["MOVED_KEYS", "migrate", "migrated_key"]

MOVED_KEYS: dict[str, str] = {"loss.repa": "model.repa", "loss.extra_token": "model.extra_token"}


def migrated_key(dotted: str) -> str:
    """A dotted key (``loss.repa``) at its current place (``model.repa``); any other key as it is."""
    return MOVED_KEYS.get(dotted, dotted)


def migrate(data: dict[str, Any]) -> dict[str, Any]:
    """A config mapping with every moved key at its current place (a new mapping; ``data`` is
    not changed)."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    for old, new in MOVED_KEYS.items():
        (old_section, old_key), (new_section, new_key) = old.split("."), new.split(".")
        section = out.get(old_section)
        if not isinstance(section, dict) or old_key not in section:
            continue
        value = section.pop(old_key)
        target = out.setdefault(new_section, {})
        if not isinstance(target, dict):
            continue  # the strict builder names a section that is not a mapping
        if new_key in target and target[new_key] != value:
            raise ConfigError(f"config error: {old}: this key moved to {new}, which is also given "
                              f"({target[new_key]!r} there, {value!r} here); give {new} only")
        target[new_key] = value
    return out
