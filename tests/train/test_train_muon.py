"""ELF's Muon (``train.optimizer: muon``): its update written out step by step, the
Newton–Schulz orthogonalisation, parameters without a gradient, and an exact resume."""

import pytest
import torch

from elfreg.train.muon import NS_COEFFICIENTS, ElfMuon, newton_schulz


def _orthogonalised(u: torch.Tensor) -> torch.Tensor:
    """Five quintic Newton–Schulz steps on the wide orientation, written out on their own."""
    a, b, c = NS_COEFFICIENTS
    x = u.T if u.shape[0] > u.shape[1] else u
    x = x / (torch.linalg.matrix_norm(x) + 1e-8)
    for _ in range(5):
        g = x @ x.T
        x = a * x + b * g @ x + c * g @ g @ x
    return x.T if u.shape[0] > u.shape[1] else x


@pytest.mark.parametrize("shape", [(6, 4), (3, 7)])  # tall: scaled by sqrt(6/4); wide: by 1
def test_two_muon_steps_follow_the_equations(shape):
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(shape))
    start = p.detach().clone()
    grads = [torch.randn(shape), torch.randn(shape)]
    opt = ElfMuon([p], lr=0.1, momentum=0.9, weight_decay=0.01)
    m, want = torch.zeros(shape), start.clone()
    for s, g in enumerate(grads, start=1):
        p.grad = g
        opt.step()
        m = 0.9 * m + 0.1 * g
        u = 0.9 * m / (1 - 0.9 ** (s + 1)) + 0.1 * g / (1 - 0.9 ** s)  # bias-corrected Nesterov
        scale = max(1.0, shape[0] / shape[1]) ** 0.5
        want = want * (1 - 0.1 * 0.01) - 0.1 * scale * _orthogonalised(u)
        assert torch.allclose(p.detach(), want, atol=1e-6), s
    assert int(opt.state[p]["step"]) == 2


def test_two_nesterov_adam_steps_follow_the_equations():
    torch.manual_seed(1)
    bias = torch.nn.Parameter(torch.randn(5))
    grads = [torch.randn(5), torch.randn(5)]
    opt = ElfMuon([bias], lr=0.05, weight_decay=0.3)  # no decay on the Adam group, as ELF's
    m, v, want = torch.zeros(5), torch.zeros(5), bias.detach().clone()
    for s, g in enumerate(grads, start=1):
        bias.grad = g
        opt.step()
        m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
        m_hat = 0.9 * m / (1 - 0.9 ** (s + 1)) + 0.1 * g / (1 - 0.9 ** s)
        want = want - 0.05 * m_hat / ((v / (1 - 0.999 ** s)).sqrt() + 1e-8)
        assert torch.allclose(bias.detach(), want, atol=1e-6), s


def test_newton_schulz_pushes_singular_values_towards_one():
    torch.manual_seed(2)
    # five quintic steps bring singular values within a factor of ~10^2.5 of the largest into
    # about [0.68, 1.2] (measured: 0.68-0.70 and 1.12-1.20); the iteration trades exactness for speed.
    # (Rectangular matrices: a square Gaussian one has a near-zero singular value of its own.)
    for shape in [(64, 16), (16, 64), (48, 20)]:
        side = min(shape)
        spread = torch.diag(torch.logspace(-0.5, 1, side))
        u = torch.randn(shape) @ spread if shape[0] >= shape[1] else spread @ torch.randn(shape)
        s = torch.linalg.svdvals(newton_schulz(u))
        assert s.min() > 0.65 and s.max() < 1.25, (shape, s.min(), s.max())
        assert torch.linalg.svdvals(u).max() / torch.linalg.svdvals(u).min() > 30  # the input was not
    assert newton_schulz(torch.randn(4, 4, dtype=torch.bfloat16)).dtype == torch.float32


def test_a_parameter_without_a_gradient_steps_as_with_a_zero_one():
    torch.manual_seed(3)
    w, b = torch.nn.Parameter(torch.randn(4, 4)), torch.nn.Parameter(torch.randn(4))
    twin_w, twin_b = torch.nn.Parameter(w.detach().clone()), torch.nn.Parameter(b.detach().clone())
    opt, twin = ElfMuon([w, b], lr=0.1), ElfMuon([twin_w, twin_b], lr=0.1)
    w.grad, b.grad = torch.randn(4, 4), torch.randn(4)
    twin_w.grad, twin_b.grad = w.grad.clone(), b.grad.clone()
    opt.step()
    twin.step()
    w.grad = b.grad = None  # a step without gradients (e.g. no decode rows)
    twin_w.grad, twin_b.grad = torch.zeros(4, 4), torch.zeros(4)
    before = b.detach().clone()
    opt.step()
    twin.step()
    assert torch.equal(w, twin_w) and torch.equal(b, twin_b)
    assert not torch.equal(b.detach(), before)  # its Adam momentum still moves it


def test_a_resumed_optimizer_continues_exactly():
    torch.manual_seed(4)
    make = lambda: [torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(3))]  # noqa: E731
    grads = [[torch.randn(5, 3), torch.randn(3)] for _ in range(3)]
    a = make()
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    opt_a = ElfMuon(a, lr=0.02)
    for g in grads:
        for p, gp in zip(a, g, strict=True):
            p.grad = gp
        opt_a.step()
    opt_b = ElfMuon(b, lr=0.02)
    for p, gp in zip(b, grads[0], strict=True):
        p.grad = gp
    opt_b.step()
    resumed = ElfMuon(b, lr=0.02)
    resumed.load_state_dict(opt_b.state_dict())
    for g in grads[1:]:
        for p, gp in zip(b, g, strict=True):
            p.grad = gp
        resumed.step()
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
