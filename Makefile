.PHONY: demo test down
demo:  ## local control plane + operator + a sample Nemotron-H HybridPDDeployment
	hack/demo.sh
test:  ## everything CI runs
	hack/test.sh
down:  ## stop the demo cluster
	.venv/bin/python -m hpd_devcluster down
