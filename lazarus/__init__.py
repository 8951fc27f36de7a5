"""Lazarus: keeps distributed training jobs running through failures.

This package is what users touch: the CLI, the job-spec models, the connection
settings, and :mod:`lazarus.rank`, the standard-library helper that training
scripts import. Importing ``lazarus`` itself stays cheap and free of temporalio
so that ``import lazarus.rank`` inside a training rank costs nothing.
"""

__version__ = "0.1.0"
