"""``elfreg study``: a resumable grid of trainings and evaluations on the toy task (the paper's
ablations, §6), with one results table that keeps the spread over training seeds apart from the
spread over sampling seeds. :mod:`.plan` reads a plan and lists its cells, :mod:`.runner` runs
them, :mod:`.report` aggregates the rows, :mod:`.cli` is the command (docs/study.md)."""
