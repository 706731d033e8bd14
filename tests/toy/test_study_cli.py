"""``elfreg study``'s command line."""

from pathlib import Path

from elfreg.toy.study.cli import default_out


def test_the_default_out_folder_is_the_plan_name_as_the_docs_write_it():
    assert default_out("configs/study-toy-level1.yaml") == Path("runs/study-toy-level1")
    assert default_out("mine.yaml") == Path("runs/study-mine")
