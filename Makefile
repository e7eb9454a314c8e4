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
# The upstream e2e suite (make conformance).
E2E_TEST  := $(K8S_BIN)/e2e.test
# The labs' cluster DNS (on by default): CoreDNS of the version kubeadm
# 1.34 deploys, and its image beside the lab's.
COREDNS_VERSION := v1.12.1
COREDNS   := $(CACHE_DIR)/coredns-$(COREDNS_VERSION)/coredns
# The peer cluster's pod network (lace-lab up --cni flannel, make bench).
FLANNEL_VERSION := v0.28.10
FLANNEL   := $(CACHE_DIR)/flannel-$(FLANNEL_VERSION)/flanneld
GO        ?= go
GOFLAGS_TEST ?=
# Cluster DNS in the labs of make lab and make test (DNS=0 goes without).
DNS ?= 1
DNS_ON := $(filter 1,$(DNS))
# The static programs of the e2e images beyond agnhost (mkimages --e2e).
E2E_K8S_IMAGE_BINS := $(K8S_BIN)/regression-issue-74839 $(K8S_BIN)/nonewprivs
E2E_IMAGE_BINS := $(E2E_K8S_IMAGE_BINS) $(K8S_BIN)/sample-apiserver $(K8S_BIN)/etcd-static

export LACE_K8S_BIN := $(K8S_BIN)
export LACE_CNI_BIN := $(CNI_BIN)
export LACE_FLANNEL := $(FLANNEL)
# The lab's image tarballs (make images); tests import them from here.
export LACE_IMAGES := $(BIN_DIR)/images
COREDNS_TAR := $(LACE_IMAGES)/coredns.tar
LAB_NAME ?= lace

CONTROLLER_GEN := $(TOOLS_BIN)/controller-gen
STATICCHECK    := $(TOOLS_BIN)/staticcheck
HELM           := $(TOOLS_BIN)/helm
# The chart tests and the lab install Lace with this helm.
export LACE_HELM := $(HELM)
# Stamped as helm's release build does: its version, and the Kubernetes
# version `helm template` and `helm lint` assume (from its client-go).
HELM_LDFLAGS = -s -w -X helm.sh/helm/v3/internal/version.version=$(shell awk '$$1 == "helm.sh/helm/v3" {print $$2}' hack/tools/helm/go.mod) \
	-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 \
	$(foreach p,chartutil lint/rules,-X helm.sh/helm/v3/pkg/$(p).k8sVersionMinor=$(shell awk '$$1 == "k8s.io/client-go" {split($$2, v, "."); print v[2]}' hack/tools/helm/go.mod))

K8S_VERSION := v1.34.4
# Upstream's pause.c, from the pinned Kubernetes module (deferred: only the
# images target runs go list).
PAUSE_SRC = $(shell cd hack/tools/k8s && $(GO) list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux
# The pinned Kubernetes module's directory (deferred, as PAUSE_SRC).
K8S_SRC = $(shell cd hack/tools/k8s && $(GO) list -m -f '{{.Dir}}' k8s.io/kubernetes)
K8S_PKGS  := k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
             k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kube-proxy \
             k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kubectl
# Stamped as the release build does, so nodes report the real kubelet version
# and version-skew checks see a real release.
K8S_LDFLAGS := -s -w $(foreach p,k8s.io/component-base/version k8s.io/client-go/pkg/version,\
	-X $(p).gitVersion=$(K8S_VERSION) -X $(p).gitMajor=1 -X $(p).gitMinor=34 \
	-X $(p).gitTreeState=clean -X $(p).buildDate=2026-01-01T00:00:00Z)

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

##@ Development

.PHONY: generate
# The network-policy-api release whose ClusterNetworkPolicy CRD the chart
# installs (docs/network-policy.md).
NETPOL_API := sigs.k8s.io/network-policy-api@v0.3.0
generate: $(CONTROLLER_GEN) ## Regenerate deepcopy code, CRD manifests (and the chart's copy) and the eBPF objects (bpf2go).
	$(CONTROLLER_GEN) object paths=./api/...
	$(CONTROLLER_GEN) crd:allowDangerousTypes=false paths=./api/... output:crd:artifacts:config=config/crd
	# sig-network's ClusterNetworkPolicy, as its pinned release ships it
	# (standard channel): Lace enforces it, the chart installs it.
	install -m 644 "$$($(GO) mod download -json $(NETPOL_API) | sed -n 's/.*"Dir": "\(.*\)",/\1/p')/config/crd/standard/policy.networking.k8s.io_clusternetworkpolicies.yaml" config/crd/
	rm -f deploy/helm/lace/crds/*.yaml && cp config/crd/*.yaml deploy/helm/lace/crds/
	$(GO) generate ./internal/datapath/...

.PHONY: check-generated
check-generated: generate ## Fail when `make generate` changes tracked files.
	@git diff --exit-code -- api config deploy internal/datapath || { echo "generated files are stale: run 'make generate' and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- api config deploy internal/datapath)" || { git status --porcelain -- api config deploy internal/datapath; echo "generated files are untracked: run 'make generate' and commit"; exit 1; }

.PHONY: deps
deps: ## Install the Debian packages the lab and tests need (only missing ones; root).
	@bash hack/deps.sh

.PHONY: build
build: ## Build the Lace binaries into ./bin.
	$(GO) build -o $(BIN_DIR)/ ./cmd/... ./lab/cmd/...

.PHONY: images
images: k8s-bins ## Build the lab's images (agnhost, pause, Lace) as tarballs into bin/images.
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o $(BIN_DIR)/static/ ./cmd/lace-agent ./cmd/lace-controller ./cmd/lace-cni ./cmd/lacectl
	$(GO) run ./lab/mkimages --out $(LACE_IMAGES) --agnhost $(K8S_BIN)/agnhost --lace-bin $(BIN_DIR)/static --pause-src $(PAUSE_SRC)

# The unit tier: every test that needs neither root, a control plane nor a
# lab (-short skips the others, each saying what it needs), as any user.
.PHONY: unit
unit: ## Unit tests: no root, no API server, no lab (go test -short ./...; any user).
	$(GO) test $(GOFLAGS_TEST) -short -count=1 ./...

.PHONY: lint
lint: $(STATICCHECK) ## gofmt, go vet and staticcheck.
	@out=$$(gofmt -l $$(git ls-files '*.go')); test -z "$$out" || { echo "gofmt needed:"; echo "$$out"; exit 1; }
	$(GO) vet ./...
	$(STATICCHECK) ./...

# The end-to-end lab runs cluster DNS, as every lab does (building CoreDNS
# first); DNS=0 brings it up without, and its DNS test then skips.
# The seed `make test`'s ten minutes of chaos draw their faults from.
CHAOS_SEED ?= 20261134
.PHONY: test
test: deps k8s-bins cni-bins build images check-generated lint $(HELM) $(K8S_BIN)/sample-apiserver $(if $(DNS_ON),coredns) ## All test tiers: unit, API, controller, datapath, lab end-to-end (root; DNS=0 leaves cluster DNS out).
	@# Ten minutes of chaos (docs/reliability.md) on a lab of their own,
	@# beside the test tiers, from a fixed seed (CHAOS_SEED) so that a
	@# failure replays; the report follows theirs, and either failing
	@# fails the target. The lab end-to-end package is the long pole (about
	@# 40 minutes beside the rest on two CPUs): its timeout leaves room.
	rm -rf $(BIN_DIR)/chaos.rc $(BIN_DIR)/chaos.log $(BIN_DIR)/chaos-logs; \
	( LACE_BIN_DIR=$(BIN_DIR) $(GO) run ./lab/cmd/lace-chaos --bin $(BIN_DIR) --name tchaos --seed $(CHAOS_SEED) \
		--duration 10m --outage 1m --burst 100 --logs-to $(BIN_DIR)/chaos-logs > $(BIN_DIR)/chaos.log 2>&1; echo $$? > $(BIN_DIR)/chaos.rc ) & \
	LACE_BIN_DIR=$(BIN_DIR) LACE_E2E_DNS=$(if $(DNS_ON),1,0) $(GO) test $(GOFLAGS_TEST) -count=1 -timeout 55m ./...; rc=$$?; \
	wait; echo "== chaos (lab/chaos)"; cat $(BIN_DIR)/chaos.log; test $$rc = 0 && test "$$(cat $(BIN_DIR)/chaos.rc)" = 0
	# The conntrack layout converter against the lace_ctv2 test build (the
	# lab's upgrade test runs that build; this checks the conversion itself).
	$(GO) test $(GOFLAGS_TEST) -count=1 -tags lace_ctv2 -run TestCTv2 ./internal/datapath

.PHONY: bench
bench: deps k8s-bins cni-bins build images flannel $(HELM) ## Benchmarks on a lab, beside peers measured in the same run (root).
	$(GO) run ./lab/bench --bin $(BIN_DIR) $(if $(ONLY),--only $(ONLY))

# Upstream's e2e suite of the pinned release, run on a lab by
# lab/conformance (docs/conformance.md): every [sig-network] describe a CNI
# and a kube-proxy replacement answer for, minus lab/conformance/skip.txt. It uses LAB_NAME when given and up (and
# leaves it up; it must run cluster DNS), else brings up CONFORMANCE_LAB
# with cluster DNS and takes it down after (KEEP=1 keeps it). Reports go to
# $(BIN_DIR)/conformance.
CONFORMANCE_LAB ?= $(if $(filter command line environment,$(origin LAB_NAME)),$(LAB_NAME),conf)
CONFORMANCE_FLAGS ?=
.PHONY: conformance
conformance: deps k8s-bins cni-bins build images coredns $(HELM) $(E2E_TEST) $(E2E_IMAGE_BINS) ## Upstream e2e [sig-network] specs on a lab (root; KEEP=1 keeps the lab).
	bash lab/conformance/deps.sh
	$(GO) run ./lab/mkimages --e2e --out $(LACE_IMAGES) --agnhost $(K8S_BIN)/agnhost --coredns $(COREDNS) \
		--k8s-src $(K8S_SRC) --e2e-bin $(K8S_BIN)
	LACE_BIN_DIR=$(BIN_DIR) $(GO) run ./lab/conformance --lab $(CONFORMANCE_LAB) --report-dir $(BIN_DIR)/conformance \
		--e2e-test $(E2E_TEST) --kubectl $(K8S_BIN)/kubectl $(if $(KEEP),--keep) $(CONFORMANCE_FLAGS)
	$(if $(POLICY_API),$(MAKE) conformance-policy-api)

# sig-network's network-policy-api conformance suite (TestConformance, the
# standard profile: ClusterNetworkPolicy's core tests) of the release the
# tools module hack/tools/policy-api pins, on a two-node lab without cluster
# DNS (docs/network-policy.md). The suite is built as a test binary from the
# module cache into $(BIN_DIR)/policy-api, its files patched for a kernel
# without SCTP by lab/conformance/policyapi at every build (nothing of
# upstream is committed); its one image, agnhost:2.45, is the pinned agnhost
# with a static bash. LAB_NAME as for conformance (a running lab is used and
# left up); KEEP=1 keeps the lab it brings up; POLICY_API_FLAGS=--run=NAME
# runs one test. `make conformance POLICY_API=1` runs it after the e2e specs.
# Reports go to $(BIN_DIR)/policy-api/report.
POLICY_API_LAB ?= $(if $(filter command line environment,$(origin LAB_NAME)),$(LAB_NAME),npapi)
POLICY_API_DIR := $(BIN_DIR)/policy-api
POLICY_API_TEST := $(POLICY_API_DIR)/conformance.test
POLICY_API_FLAGS ?=
.PHONY: conformance-policy-api
conformance-policy-api: deps k8s-bins cni-bins build images $(HELM) $(POLICY_API_TEST) ## network-policy-api's conformance suite (ClusterNetworkPolicy, standard profile) on a 2-node lab (root; KEEP=1 keeps the lab).
	bash lab/conformance/deps.sh
	$(GO) run ./lab/mkimages --policy-api --out $(LACE_IMAGES) --agnhost $(K8S_BIN)/agnhost
	LACE_BIN_DIR=$(BIN_DIR) $(GO) run ./lab/conformance/policyapi run --lab $(POLICY_API_LAB) --test-bin $(POLICY_API_TEST) \
		--deviation $(POLICY_API_DIR)/build/deviation.json --image $(LACE_IMAGES)/policy-api-agnhost.tar \
		--kubectl $(K8S_BIN)/kubectl --go $(GO) --report-dir $(POLICY_API_DIR)/report $(if $(KEEP),--keep) $(POLICY_API_FLAGS)

# The suite's test binary: the pinned module copied out of the module cache
# and patched (lab/conformance/policyapi patch), built with go test -c in a
# copy of the tools module that replaces the module by the patched copy. The
# chart's ClusterNetworkPolicy CRD (NETPOL_API, make generate) must be of
# the same release.
$(POLICY_API_TEST): hack/tools/policy-api/go.mod hack/tools/policy-api/go.sum $(wildcard lab/conformance/policyapi/*.go)
	@v=$$(awk '$$1 == "sigs.k8s.io/network-policy-api" {print $$2}' hack/tools/policy-api/go.mod); \
		test "$(NETPOL_API)" = "sigs.k8s.io/network-policy-api@$$v" || { echo "hack/tools/policy-api pins $$v, the chart's CRD is $(NETPOL_API)"; exit 1; }
	$(GO) run ./lab/conformance/policyapi patch --tools hack/tools/policy-api --out $(POLICY_API_DIR)/build \
		--module "$$(cd hack/tools/policy-api && $(GO) mod download -json sigs.k8s.io/network-policy-api | sed -n 's/.*"Dir": "\(.*\)",/\1/p')"
	cd $(POLICY_API_DIR)/build && $(GO) test -c -trimpath -o $@ sigs.k8s.io/network-policy-api/conformance

# The oracle soak draws N topologies from SEED on (default: a new seed each
# run; every disagreement prints its seed, for make soak SEED=<seed> N=1).
.PHONY: soak
soak: SEED ?= $(shell date +%s)
soak: N ?= 50
soak: deps k8s-bins cni-bins build images $(HELM) ## Compare N random topologies from SEED with the reachability oracle on a lab (root).
	LACE_BIN_DIR=$(BIN_DIR) LACE_SOAK_SEED=$(SEED) LACE_SOAK_N=$(N) $(GO) test -count=1 -v -run 'TestOracleAgreesWithPackets' -timeout 0 ./test/e2e/

# The chaos harness (lab/chaos, docs/reliability.md): a lab under a steady
# workload, faults drawn from SEED for DURATION (agents and the controller
# killed, the API server and etcd down for OUTAGE, the fabric cut and lossy,
# a burst of BURST pods while an agent dies), the invariants checked after
# each. A failure prints its seed and sequence for make chaos SEED=...;
# FAULTS=a,b draws from those kinds only. It uses LAB_NAME when given and
# up, else brings up CHAOS_LAB and takes it down after (KEEP=1 keeps it).
CHAOS_LAB ?= $(if $(filter command line environment,$(origin LAB_NAME)),$(LAB_NAME),chaos)
.PHONY: chaos
chaos: SEED ?= $(shell date +%s)
chaos: DURATION ?= 10m
chaos: OUTAGE ?= 5m
chaos: BURST ?= 300
chaos: deps k8s-bins cni-bins build images $(HELM) ## Inject faults from SEED for DURATION into a lab under load and check nothing is lost (root; FROM= the earlier revision the downgrade fault rolls back to).
	LACE_BIN_DIR=$(BIN_DIR) $(GO) run ./lab/cmd/lace-chaos --bin $(BIN_DIR) --name $(CHAOS_LAB) --seed $(SEED) \
		--duration $(DURATION) --outage $(OUTAGE) --burst $(BURST) $(if $(FAULTS),--faults $(FAULTS)) $(if $(FROM),--from $(FROM)) $(if $(KEEP),--keep)

##@ Lab

.PHONY: lab
lab: deps k8s-bins cni-bins build images $(HELM) $(if $(DNS_ON),coredns) ## Bring up a 3-node lab (LAB_NAME=lace) with cluster DNS (DNS=0: without) and run a short demo.
	$(BIN_DIR)/lace-lab up --name $(LAB_NAME) --dns=$(if $(DNS_ON),true,false)
	$(BIN_DIR)/lace-lab demo --name $(LAB_NAME)
	KUBECONFIG=$$($(BIN_DIR)/lace-lab kubeconfig --name $(LAB_NAME)) $(BIN_DIR)/lacectl trace frontend-n2 backend-n3 tcp/8080
	KUBECONFIG=$$($(BIN_DIR)/lace-lab kubeconfig --name $(LAB_NAME)) $(BIN_DIR)/lacectl trace backend-n3 frontend-n2 tcp/8080
	KUBECONFIG=$$($(BIN_DIR)/lace-lab kubeconfig --name $(LAB_NAME)) $(BIN_DIR)/lacectl topology --svg $(BIN_DIR)/topology.svg
	KUBECONFIG=$$($(BIN_DIR)/lace-lab kubeconfig --name $(LAB_NAME)) $(BIN_DIR)/lacectl status
	KUBECONFIG=$$($(BIN_DIR)/lace-lab kubeconfig --name $(LAB_NAME)) $(BIN_DIR)/lacectl services

.PHONY: lab-down
lab-down: build ## Remove the lab and everything it made.
	$(BIN_DIR)/lace-lab down --name $(LAB_NAME)

##@ Tools

$(CONTROLLER_GEN) $(STATICCHECK) &: hack/tools/go.mod hack/tools/go.sum
	cd hack/tools && GOBIN=$(TOOLS_BIN) $(GO) install sigs.k8s.io/controller-tools/cmd/controller-gen honnef.co/go/tools/cmd/staticcheck

.PHONY: tools
tools: $(CONTROLLER_GEN) $(STATICCHECK) ## Build the pinned code generators and linters.

# helm has its own module (hack/tools/helm) so that its dependencies never
# move the versions of the tools above.
$(HELM): hack/tools/helm/go.mod hack/tools/helm/go.sum
	cd hack/tools/helm && GOBIN=$(TOOLS_BIN) $(GO) install -trimpath -ldflags '$(HELM_LDFLAGS)' helm.sh/helm/v3/cmd/helm
	touch $@

.PHONY: helm
helm: $(HELM) ## Build the pinned helm the chart tests and the lab use.

.PHONY: cni-bins
cni-bins: $(CNI_BIN)/.stamp ## Build the reference CNI plugins (bridge, host-local, loopback) the lab falls back to.

$(CNI_BIN)/.stamp: hack/tools/go.mod hack/tools/go.sum
	mkdir -p $(CNI_BIN)
	cd hack/tools && $(GO) build -o $(CNI_BIN)/ github.com/containernetworking/plugins/plugins/main/bridge \
		github.com/containernetworking/plugins/plugins/ipam/host-local github.com/containernetworking/plugins/plugins/main/loopback
	touch $@

# e2e.test of the pinned release, as upstream builds it (go test -c,
# version-stamped); hack/tools/k8s/e2e.go keeps its test-only imports in
# the tools module.
$(E2E_TEST): hack/tools/k8s/go.mod hack/tools/k8s/go.sum hack/tools/k8s/e2e.go
	mkdir -p $(K8S_BIN)
	cd hack/tools/k8s && $(GO) test -c -trimpath -ldflags '$(K8S_LDFLAGS)' -o $@ k8s.io/kubernetes/test/e2e
	touch $@

.PHONY: e2e-test
e2e-test: $(E2E_TEST) ## Build the upstream e2e.test of the pinned Kubernetes into $(CACHE_DIR).

# Two e2e images hold a program of upstream's test/images (static, as
# agnhost): regression-issue-74839 (a Conntrack spec) and nonewprivs.
$(E2E_K8S_IMAGE_BINS) &: hack/tools/k8s/go.mod hack/tools/k8s/go.sum
	mkdir -p $(K8S_BIN)
	cd hack/tools/k8s && CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o $(K8S_BIN)/ \
		k8s.io/kubernetes/test/images/regression-issue-74839 k8s.io/kubernetes/test/images/nonewprivs
	touch $(E2E_K8S_IMAGE_BINS)

# The Aggregator [Conformance] spec's pod: k8s.io/sample-apiserver of the
# image's tag (v0.29.2, its own module hack/tools/sample-apiserver) and an
# etcd sidecar, the lab's etcd module built static.
$(K8S_BIN)/sample-apiserver: hack/tools/sample-apiserver/go.mod hack/tools/sample-apiserver/go.sum
	mkdir -p $(K8S_BIN)
	cd hack/tools/sample-apiserver && CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o $@ k8s.io/sample-apiserver
	touch $@

$(K8S_BIN)/etcd-static: hack/tools/etcd/go.mod hack/tools/etcd/go.sum hack/tools/etcd/cmd/etcd/main.go
	mkdir -p $(K8S_BIN)
	cd hack/tools/etcd && CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o $@ ./cmd/etcd
	touch $@

.PHONY: e2e-image-bins
e2e-image-bins: $(E2E_IMAGE_BINS) ## Build the static programs of the e2e images (regression-issue-74839, nonewprivs, sample-apiserver, etcd).

# CoreDNS has its own module (hack/tools/coredns) so that its dependencies
# never move the other tools'. Built as upstream's Makefile does (static,
# stripped) from our own main (hack/tools/coredns/main.go), which links only
# the plugins kubeadm's Corefile uses (docs/conformance.md: the cold build
# time); the target is the binary, remade only when the module changes.
$(COREDNS): hack/tools/coredns/go.mod hack/tools/coredns/go.sum hack/tools/coredns/main.go
	mkdir -p $(dir $@)
	cd hack/tools/coredns && CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o $@ .
	touch $@

$(COREDNS_TAR): $(COREDNS) lab/images/coredns.go
	$(GO) run ./lab/mkimages --coredns $(COREDNS) --out $(LACE_IMAGES)

# flannel has its own module too (hack/tools/flannel, go.mod says why it
# replaces one SDK). Built as flannel's release is: cgo on (its udp
# backend needs it), the version stamped.
$(FLANNEL): hack/tools/flannel/go.mod hack/tools/flannel/go.sum $(wildcard hack/tools/flannel/tencentvpc-stub/*/*.go)
	mkdir -p $(dir $@)
	cd hack/tools/flannel && $(GO) build -trimpath \
		-ldflags '-s -w -X github.com/flannel-io/flannel/pkg/version.Version=$(FLANNEL_VERSION)' -o $@ github.com/flannel-io/flannel
	touch $@

.PHONY: flannel
flannel: $(FLANNEL) ## Build flanneld, the pod network of the peer cluster make bench measures (lace-lab up --cni flannel).

.PHONY: coredns
coredns: $(COREDNS_TAR) ## Build CoreDNS (the labs' cluster DNS, on by default) and its image into bin/images.

.PHONY: k8s-bins
k8s-bins: $(K8S_BIN)/.stamp ## Build etcd and the pinned Kubernetes binaries into $(CACHE_DIR).

$(K8S_BIN)/.stamp: hack/tools/k8s/go.mod hack/tools/k8s/go.sum hack/tools/etcd/go.mod hack/tools/etcd/go.sum
	mkdir -p $(K8S_BIN)
	cd hack/tools/etcd && $(GO) build -o $(K8S_BIN)/etcd ./cmd/etcd
	cd hack/tools/k8s && $(GO) build -trimpath -ldflags '$(K8S_LDFLAGS)' -o $(K8S_BIN)/ $(K8S_PKGS)
	# agnhost goes into an image: static, like the upstream one.
	cd hack/tools/k8s && CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o $(K8S_BIN)/agnhost k8s.io/kubernetes/test/images/agnhost
	touch $@
