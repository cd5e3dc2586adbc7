"""Data sets by name: the catalogue (``datasets.toml``), where a named set's files are here, their
download and checks. Imports the foundations only (``errors``, ``cache``, ``schema``)."""
