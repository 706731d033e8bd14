"""An lm-evaluation-harness (lm-eval 0.4.x) model named ``elfreg``: generative tasks answered by
:func:`elfreg.sampling.generate.generate` from a checkpoint (docs/interop.md).

Importing this module registers :class:`ElfregLM` with lm-eval's model registry under ``elfreg``
when ``lm_eval`` is importable (``pip install 'elfreg[lm-eval]'``); without it the module still
imports, :class:`ElfregLM` still works on objects with an ``args`` tuple, and
:func:`require_lm_eval` fails with one line. lm-eval 0.4.13 finds models only through its own
table and what has been imported, so ``lm_eval --model elfreg`` works only in a process that
imported this module first: ``elfreg lm-eval``, ``python -m elfreg.interop.lm_eval_adapter``
(lm-eval's own command line with the model registered), or Python code that imports it.

Contracts:

- ``model_args`` keys are the adapter's (``checkpoint``, ``seed``, ``batch_size``, ``device``,
  ``precision``, ``raw_weights``, ``progress``) and every :class:`~elfreg.config.SampleConfig`
  field (``sampler``, ``nfe``, ``sc_cfg``, ...; unset ones come from the checkpoint's config).
  An unknown key, a value of the wrong type or out of range fails with one ``config error:`` line.
- ``generate_until``: every request's context is answered with seed ``seed`` (sample 0 of
  :func:`generate`), so an answer does not depend on which requests share its batch; the answer
  is cut to ``max_gen_toks`` tokens (when given), then at the first occurrence of any ``until``
  string (the earliest position wins). Other generation keys (``do_sample``, ``temperature``,
  ...) have no meaning for the flow sampler and are ignored.
- ``loglikelihood`` / ``loglikelihood_rolling`` raise :class:`UnsupportedRequest` (one line): a
  continuous diffusion model here has no token likelihood.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import yaml

from ..config import ConfigError, SampleConfig, build_dataclass
from ..device import PRECISIONS

try:  # optional: the lm-eval extra
    from lm_eval.api.model import LM as _Base
    from lm_eval.api.registry import model_registry as _registry
    from lm_eval.api.registry import register_model as _register
except ImportError:  # elfreg works without it
    _Base, _registry, _register = object, None, None  # type: ignore[assignment,misc]

MODEL_NAME = "elfreg"
# adapter keys of model_args and their types (the rest are SampleConfig fields)
ADAPTER_KEYS: dict[str, type] = {"checkpoint": str, "seed": int, "batch_size": int, "device": str,
                                 "precision": str, "raw_weights": bool, "progress": bool}
GENERATIVE_ONLY = ("the elfreg lm-eval model supports generative tasks only (output_type: generate_until): a "
                   "continuous flow-matching diffusion model has no token log-likelihood, so {kind} requests "
                   "(multiple-choice and perplexity tasks) cannot be answered")


class UnsupportedRequest(ValueError):
    """A request type the model cannot answer; the message is one line."""


class MissingExtra(RuntimeError):
    """``lm_eval`` is not installed; the message says what to install."""


def require_lm_eval() -> None:
    """Fail with one line unless ``lm_eval`` is importable."""
    if _registry is None:
        raise MissingExtra("lm-eval is not installed: pip install 'elfreg[lm-eval]' (lm-eval==0.4.13)")


def parse_model_args(text: str) -> dict[str, Any]:
    """``key=value,key=value`` → dict; each value is read as YAML (``3`` int, ``2.5`` float,
    ``true`` bool, anything else a string). One ``config error:`` line on a malformed item."""
    out: dict[str, Any] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        if "=" not in item:
            raise ConfigError(f"config error: model_args: {item!r}: expected key=value")
        key, raw = (s.strip() for s in item.split("=", 1))
        try:
            out[key] = yaml.safe_load(raw) if raw else ""
        except yaml.YAMLError:
            out[key] = raw
    return out


def split_model_args(args: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(adapter options, sampler overrides) from parsed ``model_args``, types checked; an unknown
    key fails with one line listing the known ones."""
    sample_keys = [f.name for f in dataclasses.fields(SampleConfig)]
    unknown = sorted(set(args) - set(ADAPTER_KEYS) - set(sample_keys))
    if unknown:
        known = ", ".join([*ADAPTER_KEYS, *sample_keys])
        raise ConfigError(f"config error: model_args: unknown key(s) {', '.join(unknown)} (known: {known})")
    options: dict[str, Any] = {}
    for key, kind in ADAPTER_KEYS.items():
        if key in args:
            value = args[key]
            if kind is str and isinstance(value, int | float) and not isinstance(value, bool):
                value = str(value)  # a folder named 2024, say
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise ConfigError(f"config error: model_args.{key}: expected {kind.__name__}, got {value!r}")
            options[key] = value
    overrides = {k: v for k, v in args.items() if k in sample_keys}
    build_dataclass(SampleConfig, overrides, prefix="model_args.")  # types (one line each)
    SampleConfig().replace(**overrides)  # ranges
    return options, overrides


def cut_at_stops(text: str, until: Sequence[str]) -> str:
    """``text`` up to (not including) the earliest occurrence of any non-empty stop string."""
    cuts = [text.find(stop) for stop in until if stop]
    cuts = [c for c in cuts if c >= 0]
    return text[: min(cuts)] if cuts else text


def _generation_kwargs(raw: Any) -> tuple[list[str], int | None]:
    """(stop strings, max answer tokens or None) from one request's gen_kwargs."""
    if raw is None:
        return [], None
    if not isinstance(raw, dict):
        raise ValueError(f"generate_until: expected gen_kwargs to be a dict, got {type(raw).__name__}")
    until = raw.get("until") or []
    until = [until] if isinstance(until, str) else list(until)
    if not all(isinstance(s, str) for s in until):
        raise ValueError(f"generate_until: 'until' must be a string or a list of strings, got {raw.get('until')!r}")
    limit = raw.get("max_gen_toks")
    return until, None if limit is None else int(limit)


class ElfregLM(_Base):  # type: ignore[misc,valid-type]
    """lm-eval's model interface over an elfreg checkpoint (see the module docstring)."""

    def __init__(self, checkpoint: str | None = None, batch_size: int | str | None = None,
                 max_batch_size: int | None = None, device: str | None = None, **model_args: Any) -> None:
        """Load ``checkpoint`` (required). ``batch_size``, ``max_batch_size`` and ``device`` are
        also what lm-eval passes from its own flags (``auto`` batch size: 8; ``max_batch_size`` is
        not used); every other keyword is a ``model_args`` key."""
        super().__init__()
        args = dict(model_args)
        if checkpoint is not None:
            args["checkpoint"] = checkpoint
        if device is not None:
            args["device"] = device
        if isinstance(batch_size, str) and (batch_size.startswith("auto") or batch_size.isdigit()):
            batch_size = None if batch_size.startswith("auto") else int(batch_size)  # lm-eval's --batch_size
        if batch_size is not None:
            args["batch_size"] = batch_size
        options, overrides = split_model_args(args)
        if "checkpoint" not in options:
            raise ConfigError("config error: model_args.checkpoint: required (the checkpoint folder)")
        if options.get("precision", "auto") not in PRECISIONS:
            raise ConfigError(f"config error: model_args.precision: expected one of {list(PRECISIONS)}, "
                              f"got {options['precision']!r}")
        if options.get("batch_size", 8) < 1:
            raise ConfigError(f"config error: model_args.batch_size: must be >= 1, got {options['batch_size']}")
        from ..sampling import load_checkpoint  # through the package's lazy exports (elfreg/sampling/__init__.py)

        self.models = load_checkpoint(options["checkpoint"], options.get("device", "auto"),
                                      options.get("precision", "auto"), use_ema=not options.get("raw_weights", False))
        self.sample = self.models.config.sample.replace(**overrides)
        self.seed = options.get("seed", 0)
        self.batch_size = options.get("batch_size", 8)
        self.progress = options.get("progress", False)
        self.options = options

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> ElfregLM:
        """``checkpoint=DIR,sampler=early-stop,nfe=64,...`` (values read as YAML) plus lm-eval's
        own ``batch_size``/``device`` flags, which fill only keys ``model_args`` leaves unset (its
        command line sends ``device=cuda:0`` unless told otherwise: on a CPU-only machine give
        ``--device cpu`` or ``device=cpu``); unknown keys fail with one line."""
        return cls.create_from_arg_obj(parse_model_args(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict[str, Any], additional_config: dict | None = None) -> ElfregLM:
        """The same from an already parsed ``model_args`` dict (what lm-eval's command line passes)."""
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None and k not in arg_dict}
        return cls(**arg_dict, **extra)

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """One answer per request (``Instance.args`` = (context, gen_kwargs)), in request order."""
        from ..sampling import generate
        from ..sampling.generation import answer_text

        if not requests:
            return []
        contexts = [req.args[0] for req in requests]
        kwargs = [_generation_kwargs(req.args[1] if len(req.args) > 1 else None) for req in requests]
        results = generate(self.models, contexts, self.sample, samples=1, seed=self.seed,
                           batch_size=self.batch_size, progress=self.progress and not disable_tqdm)
        tokenizer = self.models.frozen.tokenizer
        answers = []
        for req, result, (until, limit) in zip(requests, results, kwargs, strict=True):
            text = result.text if limit is None else answer_text(tokenizer, result.tokens[:limit])
            answer = cut_at_stops(text, until)
            hook = getattr(self, "cache_hook", None)
            if hook is not None:
                hook.add_partial("generate_until", req.args, answer)
            answers.append(answer)
        return answers

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """Not supported: raises :class:`UnsupportedRequest`."""
        raise UnsupportedRequest(GENERATIVE_ONLY.format(kind="loglikelihood"))

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """Not supported: raises :class:`UnsupportedRequest`."""
        raise UnsupportedRequest(GENERATIVE_ONLY.format(kind="loglikelihood_rolling"))


if _register is not None and MODEL_NAME not in _registry:  # once per process (a reload keeps the first class)
    _register(MODEL_NAME)(ElfregLM)


if __name__ == "__main__":  # lm-eval's own command line, with the elfreg model registered
    require_lm_eval()
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()
