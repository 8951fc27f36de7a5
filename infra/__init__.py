"""Test infrastructure: disposable multi-host environments for tests, benchmarks and demos
(network-namespace test hosts, a test Slurm cluster, the GPU fault jobs), fault injection
against a job's ranks (``chaos.py``), the docs site's MkDocs hook and the bench peers'
NVRx installer (``install_nvrx.py``). Not installed;
what is deployed (Helm, Compose, systemd, the image's constraints, the Grafana
dashboard) lives in ``deploy/``."""
