# Every target sets itself up: a fresh clone needs nothing but python3 (>= 3.11).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-all test-fast test-hosts test-chaos lint docs bench bench-peers dist clean

# The controller, lazarus-train, holds the rank helper (lazarus.rank) too: one install.
$(STAMP): pyproject.toml rank/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[torch,dev,deploy-check,frameworks]'
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(PY) examples/demo.py $(DEMO_ARGS)

# Four workers on two cores: most of an end-to-end test is waiting (steps sleep,
# hang clocks and grace periods run, ranks rendezvous), so running tests side by side
# cuts the wall time without starving any; worksteal keeps the tail short. Measured
# in docs/contributing.md (wall time against workers).
PYTEST_WORKERS ?= 4

# Everything: the fast tier first (a broken edit fails in under a minute, and its
# guard holds in CI too), then every test marked `slow` side by side. The two
# selections split the suite: nothing runs twice, nothing is left out.
test: setup test-hosts test-fast
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal --durations=30 -m slow $(PYTEST_ARGS)

# Everything, and every case of the long matrices that `make test` runs one case of
# (tests/tiers.py), and the harness smoke tests: about 30 minutes on 2 cores.
test-all:
	LAZARUS_TEST_ALL=1 $(MAKE) test

# The fast tier, for every edit: the pure and unit tests of tests/unit, less those
# marked `slow` (they start processes or servers, sleep, or take over a second).
# Under a minute on 2 cores; starts no server. tests/unit/conftest.py fails any test
# here that starts a process or runs over 2 s (LAZARUS_FAST_TEST_LIMIT_S).
# One process by default: on 2 shared cores xdist's start-up (each worker imports
# everything) cost more than it saved (31 s serial against 38 s with -n 2).
FAST_WORKERS ?= 0

test-fast: setup
	$(PY) -m pytest -q -n $(FAST_WORKERS) -m "not slow" tests/unit $(PYTEST_ARGS)

# The whole fault x phase chaos matrix (tests/chaos/, docs/chaos.md): every cell,
# the cross-node ones included (they need root for the SSH test hosts), as a table
# and a JSON. `make test` runs two smoke cells, `make test-all` every local cell.
# CHAOS_ARGS='--cells smoke' (or fault@phase keys) runs fewer.
test-chaos: setup
	$(PY) -m tests.chaos $(CHAOS_ARGS)

# The ssh tests run real sshd in network namespaces: install sshd and iproute2 when
# missing (root only; without root those tests skip, except under CI where they fail).
test-hosts:
	@if [ "$$(id -u)" = 0 ]; then bash infra/install-test-prereqs.sh; \
	else echo "not root: the network-namespace ssh tests will be skipped"; fi

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy lazarus workflows activities workers infra bench examples tests/chaos \
		tests/classifier_accuracy.py tests/accuracy_sets.py

# The docs site, strictly: a broken link or anchor fails (mkdocs.yml).
docs: setup
	PYTHONPATH=. $(VENV)/bin/mkdocs build --strict

# The full comparison with torchrun: every fault scenario (median of 3), the
# overhead figures and a 10-minute chaos soak per system (about 50 minutes).
bench: setup bench-peers
	$(PY) -m bench compare --repeats 3 $(BENCH_ARGS)

# The peers the comparison measures (bench/peers/): torchft==0.2.0 from the `peers`
# extra, and NVIDIA's nvidia-resiliency-ext 0.7.0, whose only wheel is for CPython
# 3.12: its pinned, checksummed wheel goes into the venv beside the rest (idempotent).
PEERS_STAMP := $(VENV)/.peers-installed

$(PEERS_STAMP): $(STAMP) infra/install_nvrx.py
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[bench,peers]'
	$(PY) -m infra.install_nvrx
	touch $(PEERS_STAMP)

bench-peers: $(PEERS_STAMP)

# The release artifacts, offline (--no-isolation: this venv's setuptools): lazarus-train's
# sdist and its wheel, built from that sdist (so the sdist is known to be complete), and
# lazarus-rank's wheel (rank/ takes its files from ../lazarus: a wheel only). Install
# with `pip install dist/lazarus_train-*.whl` (docs/getting-started.md#installing).
# The old egg-info goes first: setuptools adds every file its SOURCES.txt lists (an
# earlier install's) to the sdist.
dist: setup
	rm -rf dist lazarus_train.egg-info
	$(PY) -m build --no-isolation --outdir dist .
	$(PY) -m build --no-isolation --wheel --outdir dist rank

clean:
	rm -rf .lazarus .pytest_cache .mypy_cache .ruff_cache dist
