"""The writer's ``Tx`` by table (coordinator/store/writer.py composes them): ``base``
(the job's connection and the caches), ``held`` (rows written together), then one module
of writes per table."""
