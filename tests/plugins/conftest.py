"""Shared helpers for the component-plugin tests, handed out as fixtures.

Dimensions: ``b`` batch, ``n`` tokens, ``d`` model width. Numeric tests run in float64 with
dropout 0 and modules in eval mode; batches are right-padded as the core promises.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor, nn

from ablate.components import BuildContext, Component, TokenContext


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def right_padded(lengths: list[int], n: int, causal: bool) -> TokenContext:
    """Tokens of a right-padded batch: ``valid[b, i] = i < lengths[b]``, positions ``0..n-1``."""
    i = torch.arange(n)
    valid = i[None, :] < torch.tensor(lengths)[:, None]
    return TokenContext(valid=valid, causal=causal, positions=i.expand(len(lengths), n).clone())


@pytest.fixture
def make_tokens() -> Callable[..., TokenContext]:
    return right_padded


@pytest.fixture
def build() -> Callable[..., Component]:
    """``build(Kind, dim, model_dropout=0.0, max_len=16, **options)``: a float64 module in eval
    mode; ``model_dropout`` is the context's dropout, ``options`` the kind's own."""

    def make(
        kind: type[Component], dim: int, model_dropout: float = 0.0, max_len: int = 16, **options
    ) -> Component:
        ctx = BuildContext(dim=dim, dropout=model_dropout, max_len=max_len)
        return kind(kind.Options(**options), ctx).double().eval()

    return make


@pytest.fixture
def position_wise() -> Callable[[Callable[[Tensor], Tensor], Tensor], None]:
    """Check that ``f: [b, n, d] -> [b, n, d]`` maps each position on its own: replacing the input
    at position t changes the output at t and nowhere else (so nothing leaks from the future)."""

    def check(f: Callable[[Tensor], Tensor], x: Tensor) -> None:
        y = f(x)
        for t in range(x.shape[1]):
            x2 = x.clone()
            x2[:, t] = torch.randn_like(x2[:, t])
            y2 = f(x2)
            others = [s for s in range(x.shape[1]) if s != t]
            torch.testing.assert_close(y2[:, others], y[:, others])
            assert not torch.allclose(y2[:, t], y[:, t]), f"output at position {t} ignores its input"

    return check


def with_padding(x: Tensor, tokens: TokenContext, extra: int) -> tuple[Tensor, TokenContext]:
    """Append ``extra`` padded positions (valid False, garbage inputs) to a right-padded batch."""
    b, n = tokens.shape
    x = torch.cat([x, 100 * torch.randn(b, extra, *x.shape[2:], dtype=x.dtype)], dim=1)
    valid = torch.cat([tokens.valid, torch.zeros(b, extra, dtype=torch.bool)], dim=1)
    positions = torch.arange(n + extra).expand(b, n + extra).clone()
    return x, TokenContext(valid=valid, causal=tokens.causal, positions=positions)


@pytest.fixture
def padding_invariant() -> Callable[..., None]:
    """Check that ``f(x, tokens)`` at real positions ignores appended padded positions."""

    def check(
        f: Callable[[Tensor, TokenContext], Tensor], x: Tensor, tokens: TokenContext, extra: int = 3
    ) -> None:
        y = f(x, tokens)
        x_pad, tokens_pad = with_padding(x, tokens, extra)
        y_pad = f(x_pad, tokens_pad)
        n = x.shape[1]
        torch.testing.assert_close(y_pad[:, :n][tokens.valid], y[tokens.valid])

    return check


class _Call(nn.Module):
    """Holds ``module`` so that ``functional_call`` can swap its parameters during ``call``."""

    def __init__(self, module: nn.Module, call: Callable[..., Tensor]):
        super().__init__()
        self.module, self.call = module, call

    def forward(self, *inputs: Tensor) -> Tensor:
        return self.call(*inputs)


@pytest.fixture
def gradcheck_all() -> Callable[..., None]:
    """``torch.autograd.gradcheck`` of ``call(*inputs)`` (which uses ``module``) with respect to
    the inputs and every parameter of ``module``, in float64."""

    def check(module: nn.Module, call: Callable[..., Tensor], *inputs: Tensor) -> None:
        wrapper = _Call(module, call)
        names = [name for name, _ in wrapper.named_parameters()]
        assert names, "module has no parameters to check"
        params = [p.detach().clone().requires_grad_() for _, p in wrapper.named_parameters()]
        inputs = tuple(x.detach().clone().requires_grad_() for x in inputs)
        k = len(inputs)

        def f(*args: Tensor) -> Tensor:
            return torch.func.functional_call(wrapper, dict(zip(names, args[k:], strict=False)), args[:k])

        assert torch.autograd.gradcheck(f, (*inputs, *params), eps=1e-6, atol=1e-5)

    return check
