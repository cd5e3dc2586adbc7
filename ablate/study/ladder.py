"""A study over a ladder of model sizes (``ladder: {rungs: {w32: [model.dim=32], …}}``) as one
study per rung, as a study over several data sets is one per data set (:mod:`.several`): the study
file with the rung's overrides, ``~ladder`` and ``name=<study>.<rung>``, each with its own output
folder under the study's, so a rung's trials are ordinary trials to the driver. A rung whose
overrides break the model (``dim`` not divisible by ``heads``) is refused naming the rung."""

from __future__ import annotations

import re
from pathlib import Path

from ablate.errors import AblateError
from ablate.schema import Locator
from ablate.study.file import read_study
from ablate.study.load import Study, load_study


def laddered(study: Study) -> bool:
    """Whether the study file names a ladder of model sizes."""
    return study.spec.ladder is not None


# The width × width matrices μP scales (its "hidden weights"): every weight of a block's attention
# and FFN; their biases, the norms, the connections' own parameters and the embeddings are not.
HIDDEN_MATRICES = r"blocks\.\d+\.(attention|ffn)\..*weight$"


def rung_overrides(study: Study, rung: str) -> list[str]:
    """The overrides that make the study file one rung's study."""
    given = study.spec.ladder.rungs[rung]
    scaled = width_scaled_lr(study, given)
    return [*study.overrides, *given, *scaled, "~ladder", f"name={study.name}.{rung}"]


def width_scaled_lr(study: Study, given: list[str]) -> list[str]:
    """``ladder.lr_base_dim``'s parameter group for a rung of overrides ``given``: the hidden
    matrices at lr · lr_base_dim / dim (none without it, or where the rung's dim is no number: its
    own override is refused then, named)."""
    base = study.spec.ladder.lr_base_dim
    if base is None:
        return []
    if study.spec.train.param_groups:
        raise AblateError(f"{study.path}: ladder.lr_base_dim: sets train.param_groups; drop one of them")
    dims = [text.split("=", 1)[1] for text in given if text.split("=", 1)[0].lstrip("+") == "model.dim"]
    dim = dims[-1] if dims else str(study.spec.model.dim)
    if not dim.isdigit() or int(dim) == 0:
        return []
    lr = study.spec.train.lr * base / int(dim)
    return [f"train.param_groups=[{{params: '{HIDDEN_MATRICES}', lr: {lr:.6g}}}]"]


def per_rung(study: Study, check_files: bool = True) -> dict[str, Study]:
    """Rung → its study; a rung whose study is refused raises one line naming the rung's key in
    the study file, then the problem."""
    rungs = {}
    for rung in study.spec.ladder.rungs:
        try:
            rungs[rung] = load_study(study.path, check_files, rung_overrides(study, rung))
        except AblateError as exc:
            _, lines = read_study(study.path)
            # the file is named once, at the rung; the problem's own key and override stay
            problem = re.sub(rf"^{re.escape(str(study.path))}(:\d+)?: ", "", str(exc).replace("\n", "; "))
            raise Locator(study.path, lines).error(("ladder", "rungs", rung), problem) from None
    return rungs


def one_rung(study: Study, command: str) -> None:
    """Refuse, in one line, a ladder where ``command`` takes one study."""
    if laddered(study):
        first = rung_overrides(study, next(iter(study.spec.ladder.rungs)))[len(study.overrides) :]
        raise AblateError(f"ladder: {command} takes one rung's study (`{' '.join(first)}` for the first)")


def rung_folder(study: Study, rung: str, output: Path | None) -> Path | None:
    """A rung's --output: its own folder under the study's --output or ``output:``."""
    base = output or study.spec.output
    return Path(base) / rung if base else None
