"""The strongest peers, side by side with Lazarus in ``python -m bench compare`` (issue 30).

* :mod:`bench.peers.settings`: each peer's best working setup here, recorded in
  every results file (``config.peer_settings``);
* :mod:`bench.peers.jobs`: how the bench starts and watches their jobs from outside;
* :mod:`bench.peers.scenarios`: their ``crash`` and ``hang`` runners, and why they do
  not run the other scenarios;
* :mod:`bench.peers.scenarios_multinode`: their node loss on the SSH test hosts
  (``multinode_node_loss``);
* ``nvrx_train.py``, ``nvrx_inprocess_train.py``, ``torchft_train.py``: the example
  job plus what each peer's API needs, one file each (run as scripts, not imported);
* :mod:`bench.peers.install_nvrx`: NVRx's installer (its only wheel is for CPython 3.12).

Results: ``docs/results/2026-12-peers.md``.
"""
