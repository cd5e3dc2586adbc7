"""What a study leaves behind in MLflow: the store (study and trial runs, tags, artifacts), new
stores copied from an empty one, the provenance tags, and the finished trials read back
(``Results``). Imports ``training`` and the layers below it."""
