"""The coordinator's state in SQLite: the schema and migrations, the reads, the one writer."""
