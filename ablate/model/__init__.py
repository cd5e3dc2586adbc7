"""The model a study trains, below the task's embedding and head: the ``model:`` section's schema,
the resolved variant (each slot's kind and options), the transformer ``Block`` and ``Backbone``
with their norm placements and initialisers, and the builder that assembles them from injected
sub-modules. Imports the foundations and the plugin interface (``components``, ``registry``)."""
