"""Optimisers and learning-rate schedules by name (``train.optimizer``, ``train.lr_schedule``,
``train.param_groups``). Imports the foundations only."""
