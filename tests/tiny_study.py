"""The tiny seqrec study most tests start from, and the deep merge that patches it (a module, not
the conftest, so that helpers such as tests/corpus.py can import it: pytest imports every
conftest.py under the one module name ``conftest``)."""

from __future__ import annotations

import copy

TINY_STUDY = {
    "name": "tiny",
    "task": {
        "kind": "seqrec",
        "data": {"format": "synthetic", "users": 120, "items": 60, "min_len": 8, "max_len": 16, "seed": 0},
        "max_len": 16,
    },
    "model": {
        "dim": 16,
        "blocks": 1,
        "dropout": 0.1,
        "attention": {"kind": "softmax", "heads": 1},
        "ffn": {"kind": "pointwise"},
        "norm": {"kind": "layernorm", "placement": "pre"},
        "connection": {"kind": "residual"},
        "bias": [{"kind": "abs_pos"}],
    },
    "variants": {"mlp": {"ffn": {"kind": "mlp", "mult": 2}}},
    "train": {"epochs": 2, "batch_size": 64, "lr": 0.003, "loss": {"kind": "bce"}},
    "seeds": [0, 1],
    "metrics": {"primary": "ndcg@10", "also": ["hr@10"]},
}


def deep_update(base: dict, patch: dict) -> dict:
    out = dict(base)
    for key, value in patch.items():
        out[key] = (
            deep_update(out[key], value)
            if isinstance(value, dict) and isinstance(out.get(key), dict)
            else value
        )
    return out


def tiny_spec(patch: dict | None = None, replace: dict | None = None) -> dict:
    """The tiny study with ``patch`` deep-merged and ``replace``'s dotted keys set whole."""
    spec = deep_update(copy.deepcopy(TINY_STUDY), patch or {})
    for dotted, value in (replace or {}).items():
        *parents, last = dotted.split(".")
        node = spec
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    return spec
