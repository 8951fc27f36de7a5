"""The strongest peers, NVRx and torchft, side by side with Lazarus in ``python -m bench
compare`` (issue 30): their settings (:mod:`~bench.peers.settings`, recorded in every
results file), their jobs watched from outside (:mod:`~bench.peers.jobs`), their
scenarios (:mod:`~bench.peers.scenarios`, :mod:`~bench.peers.scenarios_multinode`),
their training scripts (run as scripts, not imported) and NVRx's installer
(:mod:`~bench.peers.install_nvrx`). Results: docs/results/2026-12-peers.md.
"""
