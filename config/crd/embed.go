// Package crd embeds the generated CustomResourceDefinitions of the
// lace-cni.io API, and those of the other APIs Lace implements (KubeVirt's
// IPAMClaim, sig-network's ClusterNetworkPolicy as its pinned release
// ships it), so that binaries (the lab, the test helpers) install exactly
// what `make generate` produced. The YAML files are generated; edit the
// types in api/ instead.
package crd

import (
	"embed"
	"fmt"
	"io/fs"
	"sort"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

//go:embed *.yaml
var files embed.FS

// All returns every CRD, sorted by name.
func All() ([]*apiextensionsv1.CustomResourceDefinition, error) {
	names, err := fs.Glob(files, "*.yaml")
	if err != nil {
		return nil, fmt.Errorf("list embedded CRDs: %w", err)
	}
	sort.Strings(names)
	out := make([]*apiextensionsv1.CustomResourceDefinition, 0, len(names))
	for _, n := range names {
		raw, err := files.ReadFile(n)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", n, err)
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.UnmarshalStrict(raw, crd); err != nil {
			return nil, fmt.Errorf("parse %s: %w", n, err)
		}
		out = append(out, crd)
	}
	return out, nil
}
