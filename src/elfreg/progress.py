"""The progress bars of the libraries elfreg calls (transformers' "Loading weights" and "Writing
model shards", huggingface_hub's downloads, datasets' maps), off wherever elfreg's own are.

The libraries read their switches in two places: a process-wide setting (what their
``disable_progress_bar(s)`` set) and, once, at import, the environment
(``HF_HUB_DISABLE_PROGRESS_BARS``, which transformers follows too, and
``HF_DATASETS_DISABLE_PROGRESS_BARS``). A child process (the toy build's side-by-side LMs) starts
from the environment alone.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

BARS_OFF_ENV = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}


def _set_library_bars(on: bool) -> None:
    """Switch the bars of every library already imported (the others read the environment)."""
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        (hf_logging.enable_progress_bar if on else hf_logging.disable_progress_bar)()  # huggingface_hub's too
    elif "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars, enable_progress_bars

        (enable_progress_bars if on else disable_progress_bars)()
    if "datasets" in sys.modules:
        from datasets.utils import disable_progress_bars, enable_progress_bars

        (enable_progress_bars if on else disable_progress_bars)()


def silence_library_bars() -> None:
    """No library progress bar in this process from now on, nor in the processes it starts: what
    ``--no-progress`` means for the libraries."""
    os.environ.update(BARS_OFF_ENV)
    _set_library_bars(False)


@contextmanager
def library_bars(on: bool) -> Iterator[None]:
    """Within the block transformers' bars (which carry huggingface_hub's) are off unless ``on``
    (elfreg's own ``progress``), as they were after it."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    if not on:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on and not on:
            hf_logging.enable_progress_bar()
