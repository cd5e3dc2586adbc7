"""A multi-head softmax attention kind: the template of a component of your own.

Dimensions: ``b`` batch, ``n`` tokens, ``h`` heads, ``d`` model width, ``e`` head width (d / h).

The block calls ``forward(x [b, n, d], tokens) -> [b, n, d]``. ``tokens`` says which tokens are
real (``tokens.valid``), whether they are used causally (``tokens.causal``: sequences), and holds
the bias channels' logit bias and rotations: ``tokens.attention_mask`` and ``tokens.rotate`` apply
all of them, so this kind works with every built-in bias and task.
"""

from __future__ import annotations

import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from ablate.components import Attention, BuildContext, Options, TokenContext, default


class MyAttentionOptions(Options):
    """What a study file may set under ``attention: {kind: my_attention, ...}``."""

    heads: int = Field(1, gt=0)
    dropout: float | None = Field(None, ge=0.0, lt=1.0)  # on the attention weights; None: the model's


class MyAttention(Attention):
    Options = MyAttentionOptions
    # Bump when the same options start to train differently (it is part of every trial's fingerprint).
    version = 1

    def __init__(self, options: MyAttentionOptions, ctx: BuildContext):
        super().__init__(options, ctx)
        if ctx.dim % options.heads:
            raise ValueError(f"dim {ctx.dim} is not divisible by heads {options.heads}")
        self.heads = options.heads
        self.qkv = nn.Linear(ctx.dim, 3 * ctx.dim)
        self.out = nn.Linear(ctx.dim, ctx.dim)
        self.p = default(options.dropout, ctx.dropout)

    def forward(self, x: Tensor, tokens: TokenContext) -> Tensor:
        b, n, d = x.shape
        qkv = self.qkv(x).view(b, n, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each [b, h, n, e]
        q, k = tokens.rotate(q, k)
        # The causal and padding mask plus any logit bias: forget it and the kit's causality check fails.
        mask, causal = tokens.attention_mask(q.dtype)
        p = self.p if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal)
        return self.out(y.transpose(1, 2).reshape(b, n, d))
