"""What the tests share: the coordinator harness, the fakes, the fault tools and the paths.

Imported as ``support.<module>``: pytest puts ``tests/`` on ``sys.path`` (``pythonpath``
in pyproject.toml), and test modules are imported by path (``--import-mode=importlib``),
so nothing else of ``tests/`` is importable by a bare name.
"""
