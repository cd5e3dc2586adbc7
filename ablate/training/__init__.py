"""One (variant, seed) trained: the ``Trainer`` step and the trial's epoch loop, micro-batch parts,
checkpoints, peak memory, FLOPs, the preflight pass, parameter matching. Imports ``study`` and the
layers below it, never the store, the driver or the report."""
