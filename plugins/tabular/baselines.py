"""tabular's trivial baselines and its protocol sentence for the report.

Fitted on the training rows only, scored on the test rows with the task's own metrics
(:mod:`.evaluation`: RMSE / MAE in the target's original units, accuracy of the predicted class):
``majority class`` (classification) or ``training mean`` (regression), which ignore the features,
and a linear model on the same prepared features the variants read (numeric columns as scaled,
categorical ones one-hot): scikit-learn's L2-regularised ``logistic regression`` (C = 1) or ``ridge``
regression (α = 1). Both solvers are deterministic: no seed.
"""

from __future__ import annotations

import numpy as np
from sklearn.linear_model import LogisticRegression, Ridge

from ablate.tasks import Baseline

from .data import Split, Table
from .evaluation import row_values, summarise

MAX_ITER = 2000  # logistic regression's lbfgs iterations


def features(part: Split, cardinalities: list[int]) -> np.ndarray:
    """``[r, k + Σ card]``: the scaled numeric columns, then each categorical column one-hot."""
    blocks = [part.numeric.astype(np.float64)]
    for j, card in enumerate(cardinalities):
        blocks.append(np.eye(card)[part.categorical[:, j]])
    return np.concatenate(blocks, axis=1) if blocks else np.zeros((len(part), 0))


def _scored(table: Table, prediction: np.ndarray, metrics: list[str]) -> dict[str, float]:
    return summarise(row_values(prediction, table.splits["test"].y_raw, table.task_type), metrics)


def trivial(table: Table, metrics: list[str]) -> list[Baseline]:
    """A constant predictor and a linear model, fitted on the training rows."""
    train, test = table.splits["train"], table.splits["test"]
    x_train, x_test = features(train, table.cardinalities), features(test, table.cardinalities)
    if table.task_type == "regression":
        constant = np.full(len(test), train.y_raw.mean())
        linear = Ridge(alpha=1.0).fit(x_train, train.y_raw).predict(x_test)
        return [
            Baseline(
                "training mean",
                "the training rows' mean target for every row",
                _scored(table, constant, metrics),
            ),
            Baseline(
                "ridge", "ridge regression (α = 1) on the prepared features", _scored(table, linear, metrics)
            ),
        ]
    labels = train.y.astype(np.int64)
    majority = int(np.bincount(labels, minlength=table.classes).argmax())  # ties: the lowest index
    constant = np.full(len(test), majority, dtype=np.int64)
    model = LogisticRegression(C=1.0, max_iter=MAX_ITER).fit(x_train, labels)
    linear = model.predict(x_test).astype(np.int64)
    return [
        Baseline(
            "majority class",
            "the training rows' most frequent class for every row",
            _scored(table, constant, metrics),
        ),
        Baseline(
            "logistic regression",
            "L2-regularised logistic regression (C = 1) on the prepared features",
            _scored(table, linear, metrics),
        ),
    ]


# How the rows of data without a CSV file are split (a CSV file's: csv_data.split_words).
SPLITS = {
    "npy": "as the folder's own train / validation / test files hold them",
    "synthetic": "in the order generated, 64% / 16% / 20% for training / validation / test",
}


def protocol_text(how: str, scaling: str, task_type: str | None) -> str:
    """The split (``how``: the words after "Rows are split"), the feature scaling, and how each
    metric is computed."""
    scaled = {
        "quantile": "mapped to a normal distribution by a quantile transform fitted on the training rows",
        "standard": "z-scored with the training rows' mean and sd",
        "none": "used as they are",
    }[scaling]
    metrics = {
        "regression": "RMSE and MAE are in the target's original units (predictions of a standardised "
        "target are mapped back), over the test rows",
        "binclass": "accuracy is the share of test rows whose class is predicted (a logit above 0)",
        "multiclass": "accuracy is the share of test rows whose class is predicted (the highest logit)",
    }
    said = metrics.get(task_type or "", "RMSE / MAE in the target's units, accuracy of the predicted class")
    return (
        f"Rows are split{how}; every test row is one test unit. Numeric features are {scaled}; "
        f"categorical ones are indexed by their training categories (an unseen category has its own "
        f"index). {said[0].upper() + said[1:]}."
    )
