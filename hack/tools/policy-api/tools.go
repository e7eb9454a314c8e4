//go:build tools

// Package tools records what `make conformance-policy-api` builds that the
// tool directives in go.mod cannot name: network-policy-api's conformance
// suite is a test binary (go test -c sigs.k8s.io/network-policy-api/conformance),
// and go mod tidy tracks the imports of a dependency's package but not those
// of its tests. The blank imports below are exactly those of
// conformance_test.go and conformance_profile_test.go at v0.3.0, so that tidy
// keeps every module the test binary needs.
package tools

import (
	_ "sigs.k8s.io/network-policy-api/conformance"

	// The test files' imports at v0.3.0.
	_ "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	_ "k8s.io/apimachinery/pkg/util/sets"
	_ "k8s.io/client-go/kubernetes"
	_ "k8s.io/client-go/plugin/pkg/client/auth"
	_ "k8s.io/client-go/rest"
	_ "k8s.io/client-go/tools/clientcmd"
	_ "sigs.k8s.io/controller-runtime/pkg/client"
	_ "sigs.k8s.io/controller-runtime/pkg/client/config"
	_ "sigs.k8s.io/network-policy-api/apis/v1beta1"
	_ "sigs.k8s.io/network-policy-api/conformance/apis/v1alpha1"
	_ "sigs.k8s.io/network-policy-api/conformance/tests"
	_ "sigs.k8s.io/network-policy-api/conformance/utils/flags"
	_ "sigs.k8s.io/network-policy-api/conformance/utils/suite"
	_ "sigs.k8s.io/yaml"
)
