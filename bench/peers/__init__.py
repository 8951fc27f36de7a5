"""The strongest peers, NVRx and torchft, side by side with Lazarus in ``python -m bench
compare`` (issue 30; bench/README.md, docs/results/2026-12-peers.md). The training
scripts here are run as scripts, never imported.
"""
