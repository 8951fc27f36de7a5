"""One-line callbacks that bring Lazarus's rank contract to training frameworks.

Each module imports its framework, so importing this package imports none of them
(``import lazarus.rank`` stays standard library only, and a training image without
Lightning never pays for it):

* :mod:`lazarus.rank.integrations.lightning`: ``LazarusCallback`` for Lightning's ``Trainer``.
* :mod:`lazarus.rank.integrations.transformers`: ``LazarusTrainerCallback`` for Hugging
  Face's ``Trainer``.
* :mod:`lazarus.rank.integrations.accelerate`: ``save_state``/``load_state`` and
  ``step_end`` for an Accelerate loop.

A framework runs under Lazarus without any of them: its own checkpoints and a plain
whole-generation restart resume it. What they add (docs/guides/frameworks.md):
heartbeats (hang and straggler detection), checkpoints committed into the verified
ledger (manifest + ``COMMITTED``, so the controller can skip a torn save), the
just-in-time save a ``pause`` asks for, and the resume point the controller chose.
"""
