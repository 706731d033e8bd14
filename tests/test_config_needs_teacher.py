"""One rule says when a run needs the frozen teacher; every place that asks gets the same answer."""

from dataclasses import replace

import pytest
import torch

from elfreg.config import Config, ConfigError, ModelConfig, needs_teacher
from elfreg.model.presets import PRESETS, build_on_meta, student_from_config
from elfreg.model.student import Student

SWITCHES = [(repa, token) for repa in (True, False) for token in ("reg", "learned", "none")]
SMALL = ModelConfig(width=16, depth=2, heads=2, repa_block=1, projector_hidden=8, time_freq_dim=8)


@pytest.mark.parametrize(("repa", "token"), SWITCHES)
def test_teacher_is_needed_exactly_for_repa_or_the_reg_token(repa, token):
    expected = repa or token == "reg"
    assert needs_teacher(repa, token) is expected
    assert Config.from_dict({"model": {"repa": repa, "extra_token": token}}).needs_teacher is expected
    assert Config.from_dict({"loss": {"repa": repa, "extra_token": token}}).needs_teacher is expected  # old keys


@pytest.mark.parametrize(("repa", "token"), SWITCHES)
def test_config_student_and_presets_follow_the_rule(repa, token):
    needed = needs_teacher(repa, token)
    model = {"repa": repa, "extra_token": token}
    if needed:
        with pytest.raises(ConfigError, match="text.teacher"):
            Config.from_dict({"text": {"teacher": None}, "model": model})
        with pytest.raises(ValueError, match="teacher_dim"):
            Student(replace(SMALL, **model), enc_dim=8, vocab_size=20, teacher_dim=None)
    else:
        Config.from_dict({"text": {"teacher": None}, "model": model})
    cfg = Config.from_dict({"model": model})
    cfg.model = replace(SMALL, **model)
    with torch.device("meta"):
        student = student_from_config(cfg, enc_dim=8, vocab_size=20, teacher_dim=12)
    assert student.teacher_dim == (12 if needed else None)


def test_presets_get_a_teacher_width_only_when_they_need_one():
    for name, preset in PRESETS.items():
        student = build_on_meta(name, enc_dim=8, vocab_size=64, teacher_dim=12)
        assert (student.teacher_dim == 12) is needs_teacher(preset.repa, preset.extra_token), name
        assert (student.use_repa, student.extra_token) == (preset.repa, preset.extra_token), name
