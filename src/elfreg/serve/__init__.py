"""Using a trained model: :func:`load` in Python (``elfreg.load``) and ``elfreg serve``, an
OpenAI-compatible server that batches requests across denoising steps (docs/serving.md).

- :mod:`.model`: ``load`` (a folder or a Hub id) and :class:`Model` (``generate``, ``sample``);
- :mod:`.batcher`: :class:`BatchedNetwork`, the network calls of concurrent requests merged;
- :mod:`.threads`: where the work runs (HTTP in a side thread, requests and network calls on
  the main thread);
- :mod:`.hub`: releases from the Hub, read without running anything from the download;
- :mod:`.protocol`: the request and answer formats (OpenAI's, with the sampler's settings), and
  the bounds every input is parsed within;
- :mod:`.limits`: the server's settings and what one request may cost;
- :mod:`.server`: the model, the batched network, admission by cost;
- :mod:`.metrics`: the Prometheus metrics;
- :mod:`.guard`: the body limit and OpenAI's error shape for every error of the HTTP side;
- :mod:`.app`: the FastAPI routes; :mod:`.cli`: ``elfreg serve``.
"""

from .model import Model, load

__all__ = ["Model", "load"]
