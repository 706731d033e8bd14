"""ELF-REG: continuous flow-matching diffusion language models."""

__version__ = "0.2.0"
