"""Lazarus: keeps distributed training jobs running through failures.

The floors, each importing only the ones below it, are the folders of the checkout:

- :mod:`lazarus.domain`: spec models, failure classes, checkpoint layout, API
  names and the activities' typed contracts (no I/O);
- :mod:`workflows`: policy, deterministic;
- :mod:`activities`: mechanics (node agents, supervision, stops, checkpoints);
- the app: :mod:`lazarus.app` (CLI, client, settings, report, metrics, dev server)
  and :mod:`workers`; the test rig :mod:`infra` sits beside it.

:mod:`lazarus.rank` is the standard-library helper training scripts import.
Importing ``lazarus`` itself stays cheap and free of temporalio so that
``import lazarus.rank`` inside a training rank costs nothing.
"""

__version__ = "0.1.0"
