"""One-line integrations of the rank helper with training frameworks.

Each module imports its framework and is imported only by scripts that use it:
``import lazarus.rank`` stays standard library only. See docs/guides/frameworks.md.

* :mod:`lazarus.rank.integrations.lightning`: PyTorch Lightning's ``Trainer``.
"""
