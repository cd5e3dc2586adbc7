"""The ``ablate`` command line and what only it needs: the commands (``cli``), what they print
(``console``, ``progress``), the launchers (workers in this process or many, GPUs, SLURM arrays), and
each command's own module. The top layer: it may import every other room; none imports it."""
