# The two commands a new user runs: `make demo` and `make test`. Each sets itself up first (idempotent).
.PHONY: setup demo test test-fast ui bench bench-quick bench-smoke bench-peers lint format

setup:
	@bash scripts/setup.sh

demo: setup
	.venv/bin/python -m scripts.demo $(ARGS)

# Two pytest processes, each with its own JVM, a whole test module at a time (module fixtures are set up once), the
# longest modules first (tests/conftest.py). TEST_WORKERS=0 runs everything in this process. The benchmark
# harness's own run on tiny data is `make bench-smoke`, not part of it.
TEST_WORKERS ?= 2
test: setup
	.venv/bin/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not bench_smoke" $(ARGS)

# The inner loop: every test that needs no JVM (definitions, lateness rules, process-function rules, ...).
test-fast: setup
	.venv/bin/python -m pytest -m "not spark" $(ARGS)

bench: setup
	.venv/bin/python -m benchmarks.run $(ARGS)

# Every measuring function of the benchmark harness once on tiny data, its reports checked (about six minutes): run it
# after changing benchmarks/.
bench-smoke: setup
	.venv/bin/python -m pytest -m bench_smoke tests/benchmarks $(ARGS)

bench-quick: setup
	.venv/bin/python -m benchmarks.run --quick $(ARGS)

# Optional, not part of `make test`: the keyed reduce through Apache Flink (apache-flink in .venv-peers, ~850 MB).
bench-peers: setup
	@test -x .venv-peers/bin/python || python3.11 -m venv .venv-peers
	@.venv-peers/bin/pip install -q -r benchmarks/peers-requirements.txt
	.venv/bin/python -m benchmarks.peers $(ARGS)

ui: setup
	.venv/bin/python -m scripts.ui $(ARGS)

lint: setup
	.venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/pyright

format: setup
	.venv/bin/ruff format . && .venv/bin/ruff check --fix .
