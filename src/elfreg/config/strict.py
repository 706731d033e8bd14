"""Strict construction of config dataclasses: from YAML data, ``section.key=value`` overrides and
command-line flags generated from the dataclass fields.

Every error is one line naming the key: ``config error: train.lr: expected float, got 'fast'``.
Lists are written one way on the command line, flags and overrides alike: comma-separated
(``--nfes 16,64``, ``eval.nfes=16,64``; a YAML list ``[16, 64]`` is read too).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the key."""


def comma_list(item: type) -> Any:
    """An argparse ``type``: comma-separated values, each converted to ``item``, as one list."""
    def parse(text: str) -> list:
        parts = [p.strip() for p in text.split(",") if p.strip()]
        if not parts:
            raise argparse.ArgumentTypeError("expected comma-separated values, got nothing")
        try:
            return [item(p) for p in parts]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {item.__name__} values, got {text!r}") from None
    parse.__name__ = f"comma-separated {item.__name__} list"
    return parse


def add_config_flags(parser: argparse.ArgumentParser, cls: type, title: str,
                     default_note: str | None = None) -> None:
    """One ``--field-name`` flag per field of the config dataclass ``cls`` (litgpt style): choices
    from ``Literal`` types, help from the field's ``help`` metadata, lists comma-separated. Flags
    default to None ("not given"), so :func:`config_flag_values` returns only what the user set;
    the help states the field's default, or ``default_note`` where something else decides it
    (sampler settings default to the checkpoint's)."""
    group = parser.add_argument_group(title)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.metadata.get("cli", True):
            continue
        hint = hints[f.name]
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        said = default_note.format(default=default) if default_note else f"default {default}"
        kwargs: dict[str, Any] = {"default": None, "dest": f.name, "help": f"{f.metadata.get('help', '')} ({said})"}
        if typing.get_origin(hint) is Literal:
            kwargs["choices"] = list(typing.get_args(hint))
        elif hint is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(hint) is list:
            kwargs.update(type=comma_list(typing.get_args(hint)[0]), metavar="A,B,...")
        elif typing.get_origin(hint) in (typing.Union, types.UnionType):
            kwargs["type"] = next(a for a in typing.get_args(hint) if a is not type(None))
        else:
            kwargs["type"] = hint
        group.add_argument("--" + f.name.replace("_", "-"), **kwargs)


def add_progress_flag(parser: argparse.ArgumentParser) -> None:
    """``--no-progress``: no progress bars (logs and CI)."""
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def config_flag_values(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The fields of ``cls`` given on the command line (flags from :func:`add_config_flags`)."""
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(cls)
            if f.metadata.get("cli", True) and getattr(args, f.name, None) is not None}


_FLOAT_RE = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def read_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """The top-level mapping of a YAML file; a missing file, a folder, non-UTF-8 bytes, invalid
    YAML (its line named) or a top level that is not a mapping fail with one line."""
    raw = Path(path).read_bytes()  # a missing file or a folder fails here, naming the path
    try:
        data = yaml.safe_load(raw.decode("utf-8")) or {}
    except UnicodeDecodeError as err:
        raise ConfigError(f"config error: {path}: not UTF-8 text (byte {err.start})") from None
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        raise ConfigError(f"config error: {path}: not valid YAML{at} ({getattr(err, 'problem', None) or err})"
                          ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"config error: {path}: top level must be a mapping")
    return data


def apply_override(data: dict[str, Any], item: str) -> None:
    """Set ``section.key=value`` in a nested dict (value parsed as YAML)."""
    if "=" not in item:
        raise ConfigError(f"config error: override {item!r}: expected key.sub=value")
    key, raw = item.split("=", 1)
    try:
        raw.encode("utf-8")  # command-line bytes that are not UTF-8 arrive as lone surrogates
    except UnicodeEncodeError:
        raise ConfigError(f"config error: {key}: the value is not UTF-8 text") from None
    parts = key.strip().split(".")
    node = data
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"config error: {key}: {part} is not a section")
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as err:
        raise ConfigError(f"config error: {key}: not a valid value ({getattr(err, 'problem', None) or err})") from None
    node[parts[-1]] = _CommandLineText(value) if isinstance(value, str) else value


class _CommandLineText(str):
    """Text of a ``key=value`` override: where a list is expected it is read as comma-separated
    values (``eval.samplers=early-stop,full-span``); text in a YAML file never is."""


def _is_list_hint(hint: Any) -> bool:
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    return any(typing.get_origin(o) is list for o in options)


def build_dataclass(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    """``cls(**data)`` for a (nested) dataclass, failing with one line on an unknown key or a
    value of the wrong type."""
    if not isinstance(data, dict):
        raise ConfigError(f"config error: {prefix.rstrip('.') or 'top level'}: expected a mapping")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        if key not in names:
            raise ConfigError(f"config error: {prefix}{key}: unknown key (known: {', '.join(sorted(names))})")
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            kwargs[f.name] = build_dataclass(hint, data[f.name], f"{prefix}{f.name}.")
        else:
            kwargs[f.name] = _check_value(f"{prefix}{f.name}", data[f.name], hint)
    return cls(**kwargs)


def _check_value(key: str, value: Any, hint: Any) -> Any:
    if isinstance(value, _CommandLineText):
        value = [yaml.safe_load(p) for p in value.split(",") if p.strip()] if _is_list_hint(hint) else str(value)
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        return build_dataclass(hint, value, f"{key}.")
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"config error: {key}: expected a mapping, got {value!r}")
        keys, values = typing.get_args(hint)
        return {_check_value(f"{key}", k, keys): _check_value(f"{key}.{k}", v, values) for k, v in value.items()}
    if origin is Literal:
        allowed = typing.get_args(hint)
        if value not in allowed:
            raise ConfigError(f"config error: {key}: expected one of {list(allowed)}, got {value!r}")
        return value
    if origin is list:
        if isinstance(value, int | float) and not isinstance(value, bool):
            value = [value]  # eval.nfes=16: a list of one
        if not isinstance(value, list):
            raise ConfigError(f"config error: {key}: expected a list, got {value!r}")
        (item,) = typing.get_args(hint)
        return [_check_value(f"{key}[{i}]", v, item) for i, v in enumerate(value)]
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        for option in options:
            if option is type(None):
                continue
            try:
                return _check_value(key, value, option)
            except ConfigError:
                pass
        names = " or ".join("null" if o is type(None) else o.__name__ for o in options)
        raise ConfigError(f"config error: {key}: expected {names}, got {value!r}")
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is float and isinstance(value, str) and _FLOAT_RE.fullmatch(value.strip()):
        return float(value)  # YAML 1.1 reads "2e-3" (no dot) as a string
    if hint in (int, float) and isinstance(value, bool):
        raise ConfigError(f"config error: {key}: expected {hint.__name__}, got {value!r}")
    if not isinstance(value, hint):
        raise ConfigError(f"config error: {key}: expected {hint.__name__}, got {value!r}")
    return value
