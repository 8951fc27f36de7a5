"""The domain floor: what every other floor speaks, with no I/O of its own.

Spec models, failure classes, the checkpoint layout, the environment contract
with ranks, the workflow's API names and the activities' typed contracts. It
imports nothing above it, and the modules :mod:`lazarus.rank` uses
(``environment``, ``checkpoint_layout``, ``chaos_points``) stay standard-library
only so that a training rank can import them for free.
"""
