.PHONY: demo test test-fast down
demo:  ## local control plane + operator + a sample Nemotron-H HybridPDDeployment
	hack/demo.sh
test:  ## everything CI runs (hack/test.sh: installs, lints, then every test tier in parallel workers)
	hack/test.sh
test-fast:  ## lint, types, import contracts, unit + CRD tests, render goldens: no cluster, no builds (after hack/setup.sh)
	@test -x .venv/bin/python || { echo "no .venv: run hack/setup.sh (or make test) once" >&2; exit 2; }
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy
	.venv/bin/lint-imports
	.venv/bin/python -m pytest -q -p no:cacheprovider --durations=10 tests/unit tests/crd
down:  ## stop the demo operator and the demo cluster
	hack/demo-down.sh
