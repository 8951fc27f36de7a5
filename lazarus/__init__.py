"""Lazarus: keeps distributed training jobs running through failures.

The package holds every floor, each importing only the ones below it:

- :mod:`lazarus.domain`: spec models, failure classes, checkpoint layout, API
  names and the activities' typed contracts (no I/O);
- :mod:`lazarus.workflows`: policy, deterministic (the ``workflows/`` folder);
- :mod:`lazarus.activities`: mechanics (the ``activities/`` folder);
- the app: :mod:`lazarus.cli`, :mod:`lazarus.client`, :mod:`lazarus.settings`,
  the dev server, the local stack, chaos, :mod:`lazarus.workers` and
  :mod:`lazarus.infra`.

:mod:`lazarus.rank` is the standard-library helper training scripts import.
Importing ``lazarus`` itself stays cheap and free of temporalio so that
``import lazarus.rank`` inside a training rank costs nothing.
"""

__version__ = "0.1.0"
