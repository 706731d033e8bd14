"""ELF's Muon (``train.optimizer: muon``): its update written out step by step, the
Newton–Schulz orthogonalisation (alone and stacked), parameters without a gradient, and an exact
resume."""

import pytest
import torch

from elfreg.train.muon import NS_COEFFICIENTS, ElfMuon, newton_schulz, stacks


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


def test_a_stack_orthogonalises_each_matrix_on_its_own():
    torch.manual_seed(5)
    # scales far apart: a norm taken over the stack instead of per matrix would shrink the small
    # ones' steps and fail here
    mats = [torch.randn(6, 9) * scale for scale in (1e-3, 1.0, 1e3)]
    stacked = newton_schulz(torch.stack(mats))
    for m, got in zip(mats, stacked, strict=True):
        torch.testing.assert_close(got, newton_schulz(m), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got, _orthogonalised(m), rtol=1e-4, atol=1e-5)
    tall = torch.randn(3, 9, 6)  # a stack of tall matrices keeps their orientation
    torch.testing.assert_close(newton_schulz(tall)[1], newton_schulz(tall[1]), rtol=1e-5, atol=1e-6)


def test_stacks_group_by_shape_in_order_and_hold_at_most_their_bytes():
    ps = [torch.zeros(4, 8), torch.zeros(8, 4), torch.zeros(4, 8), torch.zeros(4, 8),
          torch.zeros(2, 2, dtype=torch.float64)]
    assert [[id(p) for p in s] for s in stacks(ps)] == [[id(ps[0]), id(ps[2]), id(ps[3])], [id(ps[1])], [id(ps[4])]]
    capped = stacks(ps, max_bytes=2 * 4 * 8 * 4)  # two 4x8 fp32 matrices a stack
    assert [len(s) for s in capped] == [2, 1, 1, 1]
    assert [len(s) for s in stacks(ps, max_bytes=0)] == [1] * 5  # one call per matrix


@pytest.mark.parametrize("stack_bytes", [0, 4 * 6 * 4 * 2])  # one matrix a call; two a call
def test_stacked_steps_equal_steps_of_one_call_per_matrix(stack_bytes):
    torch.manual_seed(6)
    make = lambda: [torch.nn.Parameter(torch.randn(shape)) for shape in ((4, 6), (6, 4), (4, 6), (4, 6), (5,))]  # noqa: E731
    a = make()
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    opt_a, opt_b = ElfMuon(a, lr=0.05, weight_decay=0.1), ElfMuon(b, lr=0.05, weight_decay=0.1, stack_bytes=stack_bytes)
    for _ in range(3):
        for p, q in zip(a, b, strict=True):
            p.grad = torch.randn(p.shape)
            q.grad = p.grad.clone()
        opt_a.step()
        opt_b.step()
    for p, q in zip(a, b, strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def _reference_step(params: list[torch.Tensor], state: dict, s: int, lr: float, decay: float) -> None:
    """One ElfMuon step written a tensor at a time, each update's operations in the order the
    optimiser's ``_foreach`` calls make them (the optimiser's own code before it took lists)."""
    for p in params:
        g = torch.zeros_like(p) if p.grad is None else p.grad
        st = state.setdefault(id(p), {})
        if p.dim() == 2:
            m = st.setdefault("momentum", torch.zeros_like(p))
            m.lerp_(g, 1 - 0.95)
            u = 0.95 * m / (1 - 0.95 ** (s + 1)) + (1 - 0.95) * g / (1 - 0.95 ** s)
            update = newton_schulz(u) * max(1.0, p.shape[0] / p.shape[1]) ** 0.5
            p.mul_(1 - lr * decay)
        else:
            m = st.setdefault("exp_avg", torch.zeros_like(p))
            v = st.setdefault("exp_avg_sq", torch.zeros_like(p))
            m.lerp_(g, 1 - 0.9)
            v.lerp_(g.square(), 1 - 0.999)
            m_hat = 0.9 * m / (1 - 0.9 ** (s + 1)) + (1 - 0.9) * g / (1 - 0.9 ** s)
            update = m_hat / ((v / (1 - 0.999 ** s)).sqrt() + 1e-8)
        p.add_(update, alpha=-lr)


def test_steps_over_tensor_lists_equal_steps_a_tensor_at_a_time_bit_for_bit():
    torch.manual_seed(7)
    shapes = ((6, 4), (4, 6), (4, 6), (5,), (3,), (6, 4))
    a = [torch.nn.Parameter(torch.randn(shape)) for shape in shapes]
    b = [p.detach().clone() for p in a]
    opt, state = ElfMuon(a, lr=0.05, weight_decay=0.1, stack_bytes=0), {}
    for s in range(1, 5):
        for p, q in zip(a, b, strict=True):
            # step 3: the vectors get no gradient (stepped as with a zero one)
            p.grad = None if s == 3 and p.dim() == 1 else torch.randn(p.shape)
            q.grad = None if p.grad is None else p.grad.clone()
        opt.step()
        _reference_step(b, state, s, lr=0.05, decay=0.1)
        assert all(torch.equal(p.detach(), q) for p, q in zip(a, b, strict=True)), s
