.PHONY: demo test down
demo:  ## local control plane + operator + a sample Nemotron-H HybridPDDeployment
	hack/demo.sh
test:  ## everything CI runs
	hack/test.sh
down:  ## stop the demo operator and the demo cluster
	hack/demo-down.sh
