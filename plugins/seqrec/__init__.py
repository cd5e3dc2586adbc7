"""Sequential recommendation task (``seqrec``): next-item prediction, leave-one-out split,
HR@K / NDCG@K / MRR by full ranking or SASRec's sampled protocol."""

from .batches import Batch
from .cache import cached
from .data import Interactions, synthetic
from .evaluation import popularity_evaluation
from .losses import BCE, LossOptions, SampledSoftmax, Softmax
from .model import SeqRecModel
from .options import MovieLensData, SeqRecOptions, SyntheticData, TableData, UserItemData, UserLinesData
from .readers import read_movielens, read_table, read_user_item, read_user_lines
from .task import SeqRecTask

__all__ = [
    "BCE",
    "Batch",
    "Interactions",
    "LossOptions",
    "MovieLensData",
    "SeqRecModel",
    "SeqRecOptions",
    "SampledSoftmax",
    "SeqRecTask",
    "Softmax",
    "SyntheticData",
    "TableData",
    "UserItemData",
    "UserLinesData",
    "cached",
    "popularity_evaluation",
    "read_movielens",
    "read_table",
    "read_user_item",
    "read_user_lines",
    "synthetic",
]
