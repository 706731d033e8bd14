"""Using a trained model: :func:`load` in Python (``elfreg.load``) and ``elfreg serve``, an
OpenAI-compatible server that batches requests across denoising steps (docs/serving.md).

- :mod:`.model`: ``load`` (a folder or a Hub id) and :class:`Model` (``generate``, ``sample``);
- :mod:`.batcher`: :class:`BatchedNetwork`, the network calls of concurrent requests merged;
- :mod:`.threads`: where the work runs (HTTP in a side thread, requests and network calls on
  the main thread);
- :mod:`.protocol`: the request and answer formats (OpenAI's, with the sampler's settings);
- :mod:`.app`: the FastAPI application; :mod:`.cli`: ``elfreg serve``.
"""

from .model import Model, load

__all__ = ["Model", "load"]
