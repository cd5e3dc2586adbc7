"""The ``model:`` section of a study file: the backbone's shape and each slot's ``{kind, **options}``
(the options are validated by the kind's own model when the study is resolved)."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from ablate.model.blocks import INITIALISERS, PLACEMENTS
from ablate.schema import Strict


class ComponentSpec(BaseModel):
    """``{kind: NAME, **options}``; the options are validated by the kind's own model."""

    model_config = ConfigDict(extra="allow")
    kind: str

    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class NormSpec(ComponentSpec):
    # A block option, not one of the norm kind's.
    placement: PLACEMENTS.field = "pre"

    def options(self) -> dict[str, Any]:
        return {k: v for k, v in super().options().items() if k != "placement"}


class ModelSpec(Strict):
    dim: int = Field(64, gt=0)
    blocks: int = Field(2, ge=0)
    dropout: float = Field(0.2, ge=0.0, lt=1.0)
    attention: ComponentSpec = ComponentSpec(kind="softmax")
    ffn: ComponentSpec = ComponentSpec(kind="pointwise")
    norm: NormSpec = NormSpec(kind="layernorm")
    connection: ComponentSpec = ComponentSpec(kind="residual")
    bias: list[ComponentSpec] = [ComponentSpec(kind="abs_pos")]
    # A norm (model.norm's kind and options) after the last block; HSTU and FuXi-α have none.
    final_norm: bool = True
    # Weights of the blocks' linear layers: each kind's own initialisation (``default``: PyTorch's
    # for nn.Linear), Xavier-normal for all of them (SASRec's released code), or Xavier-uniform with
    # zero biases for them and the blocks' tables (TensorFlow's defaults: TiSASRec's code).
    init: INITIALISERS.field = "default"
    # Free-form settings handed to a task that trains its own model (``Task.run_trial``, e.g. the
    # ``function`` task): variants patch them as they patch the rest of ``model:``.
    config: dict[str, Any] = {}

    # Options added after stores existed, left out of fingerprints at their defaults (as TrainSpec's).
    LATER_OPTIONS: ClassVar[tuple[str, ...]] = ("final_norm", "config")
    ADDED_LATER: ClassVar[dict[str, Any]] = {"config": {}}

    def later_options_at_default(self) -> set[str]:
        """The :attr:`LATER_OPTIONS` a fingerprint may leave out."""
        fields = type(self).model_fields
        return {name for name in self.LATER_OPTIONS if getattr(self, name) == fields[name].get_default()}
