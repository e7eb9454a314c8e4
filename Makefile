# Lace: run `make help` for the targets.

SHELL := /bin/bash
.DEFAULT_GOAL := help

# Binaries built from pinned modules live outside the source tree so that a
# fresh clone stays clean and a second build is a no-op.
CACHE_DIR ?= $(HOME)/.cache/lace
BIN_DIR   ?= $(CURDIR)/bin
TOOLS_BIN := $(CACHE_DIR)/tools
K8S_BIN   := $(CACHE_DIR)/k8s-v1.34.4
CNI_BIN   := $(CACHE_DIR)/cni-v1.9.1
GO        ?= go
GOFLAGS_TEST ?=

export LACE_K8S_BIN := $(K8S_BIN)
export LACE_CNI_BIN := $(CNI_BIN)
LAB_NAME ?= lace

CONTROLLER_GEN := $(TOOLS_BIN)/controller-gen
STATICCHECK    := $(TOOLS_BIN)/staticcheck

K8S_TOOLS := kube-apiserver kube-controller-manager kube-scheduler kube-proxy agnhost
K8S_PKGS  := k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
             k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kube-proxy \
             k8s.io/kubernetes/test/images/agnhost k8s.io/kubernetes/cmd/kubectl

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

##@ Development

.PHONY: generate
generate: $(CONTROLLER_GEN) ## Regenerate deepcopy code, CRD manifests and the eBPF objects (bpf2go).
	$(CONTROLLER_GEN) object paths=./api/...
	$(CONTROLLER_GEN) crd:allowDangerousTypes=false paths=./api/... output:crd:artifacts:config=config/crd
	$(GO) generate ./internal/datapath/...

.PHONY: check-generated
check-generated: generate ## Fail when `make generate` changes tracked files.
	@git diff --exit-code -- api config internal/datapath || { echo "generated files are stale: run 'make generate' and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- api config internal/datapath)" || { git status --porcelain -- api config internal/datapath; echo "generated files are untracked: run 'make generate' and commit"; exit 1; }

.PHONY: build
build: ## Build the Lace binaries into ./bin.
	$(GO) build -o $(BIN_DIR)/ ./cmd/...

.PHONY: lint
lint: $(STATICCHECK) ## gofmt, go vet and staticcheck.
	@out=$$(gofmt -l $$(git ls-files '*.go')); test -z "$$out" || { echo "gofmt needed:"; echo "$$out"; exit 1; }
	$(GO) vet ./...
	$(STATICCHECK) ./...

.PHONY: test
test: k8s-bins cni-bins build check-generated lint ## All test tiers: unit, API, controller, datapath, lab end-to-end (root).
	LACE_BIN_DIR=$(BIN_DIR) $(GO) test $(GOFLAGS_TEST) -count=1 -timeout 30m ./...

.PHONY: bench
bench: k8s-bins cni-bins build ## Benchmarks on a lab, beside peers measured in the same run (root).
	$(GO) run ./bench --bin $(BIN_DIR)

##@ Lab

.PHONY: lab
lab: k8s-bins cni-bins build ## Bring up a 3-node lab (LAB_NAME=lace) and run a short demo.
	$(BIN_DIR)/lace-lab up --name $(LAB_NAME)
	$(BIN_DIR)/lace-lab demo --name $(LAB_NAME)
	KUBECONFIG=$$($(BIN_DIR)/lace-lab kubeconfig --name $(LAB_NAME)) $(BIN_DIR)/lacectl status

.PHONY: lab-down
lab-down: build ## Remove the lab and everything it made.
	$(BIN_DIR)/lace-lab down --name $(LAB_NAME)

##@ Tools

$(CONTROLLER_GEN) $(STATICCHECK) &: hack/tools/go.mod hack/tools/go.sum
	cd hack/tools && GOBIN=$(TOOLS_BIN) $(GO) install sigs.k8s.io/controller-tools/cmd/controller-gen honnef.co/go/tools/cmd/staticcheck

.PHONY: tools
tools: $(CONTROLLER_GEN) $(STATICCHECK) ## Build the pinned code generators and linters.

.PHONY: cni-bins
cni-bins: $(CNI_BIN)/.stamp ## Build the reference CNI plugins (bridge, host-local, loopback) the lab falls back to.

$(CNI_BIN)/.stamp: hack/tools/go.mod hack/tools/go.sum
	mkdir -p $(CNI_BIN)
	cd hack/tools && $(GO) build -o $(CNI_BIN)/ github.com/containernetworking/plugins/plugins/main/bridge \
		github.com/containernetworking/plugins/plugins/ipam/host-local github.com/containernetworking/plugins/plugins/main/loopback
	touch $@

.PHONY: k8s-bins
k8s-bins: $(K8S_BIN)/.stamp ## Build etcd and the pinned Kubernetes binaries into $(CACHE_DIR).

$(K8S_BIN)/.stamp: hack/tools/k8s/go.mod hack/tools/k8s/go.sum hack/tools/etcd/go.mod hack/tools/etcd/go.sum
	mkdir -p $(K8S_BIN)
	cd hack/tools/etcd && $(GO) build -o $(K8S_BIN)/etcd ./cmd/etcd
	cd hack/tools/k8s && $(GO) build -o $(K8S_BIN)/ $(K8S_PKGS)
	touch $@
