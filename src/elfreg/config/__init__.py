"""The settings room: every setting of an elfreg run and how it is read.

- :mod:`.settings`: the run config's sections as dataclasses (``text``, ``model``, ``flow``,
  ``loss``, ``data``, ``train``, ``sample``, ``eval``), their validation with one-line errors,
  the allowed values of each choice (spelled once, as a ``Literal`` its tuple is read from);
- :mod:`.data`: the ``data`` section (sources, filters, mixtures, templates, decontamination);
- :mod:`.strict`: strict YAML → dataclass building, ``section.key=value`` overrides, comma
  lists, and CLI flags generated from dataclass fields;
- :mod:`.migration`: keys of earlier versions' configs (``loss.repa`` → ``model.repa``) and the
  one migration every config is built through.

Callers import every name from here (``from elfreg.config import Config, SampleConfig``).
"""

from .settings import *  # noqa: F403 - the room's public names, listed in settings.__all__
from .settings import __all__ as _settings_all
from .strict import add_progress_flag, comma_list, read_yaml_mapping

__all__ = [*_settings_all, "add_progress_flag", "comma_list", "read_yaml_mapping"]
