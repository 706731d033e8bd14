"""Canvas trimming (``sample.trim``) on stub networks whose decoded answer end is known."""

import pytest
import torch
from sampling_stubs import FixedNetwork, MovingEndNetwork

from elfreg.config import ConfigError, SampleConfig
from elfreg.sampling import run_sampler
from elfreg.sampling.checks import TRIM_BUCKET, answer_end, trimmed_length

EOS, LENGTH, DIM = 0, 40, 8
FIRST_EOS = 11  # the stub's answer: tokens 1..7 up to canvas position 10, EOS from 11 on (end 12)


def _problem(batch: int, moving: set[int] = frozenset()):
    g = torch.Generator().manual_seed(0)
    codebook = 3 * torch.eye(DIM)  # nearest-codebook decoding returns the target exactly
    target = torch.randint(1, DIM, (LENGTH,), generator=g)
    target[FIRST_EOS:] = EOS
    states = torch.randn(batch, LENGTH, DIM, generator=g)
    states[:, 0, 0] = torch.arange(batch, dtype=torch.float32)  # row tag of MovingEndNetwork
    mask = torch.arange(LENGTH)[None, :] < torch.tensor([3 + k % 2 for k in range(batch)])[:, None]
    net = MovingEndNetwork(codebook[target], codebook, torch.randn(4, generator=g), moving=set(moving), eos=EOS)
    return net, states, mask, target


def _trim(**kw) -> SampleConfig:
    return SampleConfig(**{"nfe": 10, "trim": True, "trim_interval": 2, "trim_patience": 1, "trim_margin": 2, **kw})


def test_answer_end_and_the_kept_canvas():
    ids = torch.tensor([[-1, -1, 5, 0, 0, 0], [-1, 3, 4, 6, 2, 1], [-1, 0, 0, 0, 0, 0]])
    assert answer_end(ids, EOS).tolist() == [4, 6, 2]
    assert trimmed_length(torch.tensor([4, 6, 2, 30, 40]), 2, 40).tolist() == [8, 8, 8, 32, 40]
    assert trimmed_length(torch.tensor([8, 9]), 0, 100).tolist() == [8, 2 * TRIM_BUCKET]


def test_a_settled_answer_runs_on_its_trimmed_canvas_from_the_next_step():
    net, states, mask, target = _problem(batch=1)
    out = run_sampler(net, states, mask, [0], _trim(), eos_id=EOS)
    # checks after steps 2 and 4 read end 12 twice → trimmed to 16 = ceil((12 + 2) / 8) * 8
    assert [c["z"].shape[1] for c in net.denoise_log] == [LENGTH] * 4 + [16] * 5
    assert [c["x"].shape[1] for c in net.decode_log] == [LENGTH, LENGTH, 16]
    assert out.denoiser_calls.tolist() == [9] and out.decoder_calls.tolist() == [3] and out.nfe.tolist() == [12]
    assert out.canvas_len.tolist() == [16]
    answer = ~mask[0]
    assert torch.equal(out.token_ids[0][answer], target[answer])  # EOS fills the trimmed positions
    assert torch.all(out.token_ids[0, 16:] == EOS)


def test_trimming_keeps_the_answer_of_a_network_that_ignores_the_canvas_length():
    net, states, mask, _ = _problem(batch=2)
    plain = run_sampler(FixedNetwork(net.x_hat, net.codebook, net.reg_hat), states, mask, [3, 4],
                        SampleConfig(nfe=10), eos_id=EOS)
    trimmed = run_sampler(net, states, mask, [3, 4], _trim(), eos_id=EOS)
    assert torch.equal(plain.token_ids, trimmed.token_ids)
    assert torch.equal(plain.exit_time, trimmed.exit_time) and torch.equal(plain.steps, trimmed.steps)
    assert plain.canvas_len.tolist() == [LENGTH, LENGTH] and trimmed.canvas_len.tolist() == [16, 16]


def test_an_answer_end_that_keeps_moving_is_never_trimmed_and_checks_while_a_trim_could_pay():
    net, states, mask, _ = _problem(batch=2, moving={1})
    out = run_sampler(net, states, mask, [0, 1], _trim(), eos_id=EOS)
    # row 1 checks after steps 2, 4, 6 and 8 (a trim after step 8 still leaves step 9 to run)
    assert out.decoder_calls.tolist() == [3, 5] and out.denoiser_calls.tolist() == [9, 9]
    assert out.canvas_len.tolist() == [16, LENGTH]
    # after row 0's trim every step makes one call per canvas length
    assert [(c["z"].shape[0], c["z"].shape[1]) for c in net.denoise_log[4:6]] == [(1, 16), (1, LENGTH)]


@pytest.mark.parametrize("sampler", ["early-stop", "full-span", "renoise"])
@pytest.mark.parametrize("prompt_cfg", [1.0, 2.0])
def test_a_sample_does_not_depend_on_its_batch_mates(sampler, prompt_cfg):
    sample = _trim(sampler=sampler, prompt_cfg=prompt_cfg)
    net, states, mask, _ = _problem(batch=3, moving={1})
    batched = run_sampler(net, states, mask, [5, 6, 7], sample, eos_id=EOS)
    assert sorted(batched.canvas_len.tolist()) == [16, 16, LENGTH]
    for k in range(3):
        alone_net, *_ = _problem(batch=3, moving={1})
        alone = run_sampler(alone_net, states[k:k + 1], mask[k:k + 1], [5 + k], sample, eos_id=EOS)
        assert torch.equal(alone.token_ids[0], batched.token_ids[k])
        assert (alone.nfe.item(), alone.canvas_len.item()) == (batched.nfe[k].item(), batched.canvas_len[k].item())


@pytest.mark.parametrize("nfe, checks, canvas", [(7, 0, LENGTH), (8, 3, 16)])
def test_a_check_is_made_only_if_its_trim_leaves_a_step_to_save(nfe, checks, canvas):
    # patience 2, checks every 2 steps: a trim needs checks after steps 2, 4 and 6; with 6 steps
    # (NFE 7) it would come after the last one, so no check is made; with 7 steps all three are
    net, states, mask, _ = _problem(batch=2)
    out = run_sampler(net, states, mask, [0, 1], _trim(nfe=nfe, trim_patience=2), eos_id=EOS)
    assert out.decoder_calls.tolist() == [1 + checks] * 2 and out.canvas_len.tolist() == [canvas] * 2
    assert [c["z"].shape[1] for c in net.denoise_log[-1:]] == [canvas]


def test_bad_trim_settings_fail_with_the_key():
    with pytest.raises(ConfigError, match="sample.trim: cannot be combined with the adaptive sampler"):
        SampleConfig(sampler="adaptive", trim=True).validate()
    for key, value in [("trim_margin", -1), ("trim_interval", 0), ("trim_patience", 0)]:
        with pytest.raises(ConfigError, match=f"sample.{key}"):
            SampleConfig(**{key: value}).validate()
    net, states, mask, _ = _problem(batch=1)
    with pytest.raises(ValueError, match="needs eos_id"):
        run_sampler(net, states, mask, [0], _trim())
    with pytest.raises(ValueError, match="records no trajectories"):
        run_sampler(net, states, mask, [0], _trim(), eos_id=EOS, record_every=1)
