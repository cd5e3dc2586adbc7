"""The kind against ablate's plugin test kit: shapes, gradients, determinism, causality, padding."""

import pytest
from my_attention import MyAttention

from ablate import testkit


@pytest.mark.parametrize("check", testkit.CHECKS)
def test_my_attention_conforms(check):
    testkit.check(MyAttention, check)


def test_with_four_heads():
    testkit.check_all(MyAttention, {"heads": 4})
