"""Interoperation with other evaluation tools (docs/interop.md).

- :mod:`elfreg.interop.lm_eval_adapter`: an lm-evaluation-harness model named ``elfreg``
  (generative tasks only); importing it registers the model when ``lm_eval`` is installed.
- :mod:`elfreg.interop.cli`: ``elfreg lm-eval``.

Nothing here imports ``lm_eval`` at package import time: elfreg works without the
``lm-eval`` extra.
"""
