"""A study file read and resolved: its text (YAML / TOML) with every key's line, ``key=value``
overrides, the schema section by section, search spaces, variants and grid points, sizes checked on
the meta device, output folders, and ``load_study`` that resolves kinds and checks compatibility.
Imports the foundations, the plugin interface, ``stats`` (report settings), ``data``, ``model`` and
``optim``."""
