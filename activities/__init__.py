"""Mechanics with side effects: launching, supervising and stopping ranks, checkpoints.

Every activity here is safe to retry on another worker: it re-attaches to, or
adopts, what is already running and never launches duplicates.
"""
