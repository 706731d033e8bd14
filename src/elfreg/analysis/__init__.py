"""Analyses of a trained checkpoint's sampling that the paper reports (ELF-REG §4, App. C).

- :mod:`.trajectory_metrics`: the pure metrics (endpoint error, stable tokens, agreements, flips,
  finite-difference acceleration, Prop. 1 and Prop. 2 checks), on plain tensors;
- :mod:`.measure`: the sampling runs of one batch (a master trajectory per (problem, seed), a
  uniform-grid trajectory for the acceleration) and the per-pair rows;
- :mod:`.report`: the aggregate (``table11.json``), the printed table and ``fig2.png``;
- :mod:`.cli`: ``elfreg analyze trajectory`` (resumable, locked, identified output folder).
"""
