package v1alpha1_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
)

var yamlBlock = regexp.MustCompile("(?s)```yaml\n(.*?)```")

// TestDocExamples decodes every Kubernetes object in the YAML examples of
// docs/*.md strictly into its Go type: a misspelt or misplaced field in
// the documentation fails here, without an API server. Blocks without an
// apiVersion (chart values) are not objects and are skipped.
func TestDocExamples(t *testing.T) {
	sch := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(sch); err != nil {
		t.Fatal(err)
	}
	if err := lacev1.AddToScheme(sch); err != nil {
		t.Fatal(err)
	}
	pages, err := filepath.Glob("../../docs/*.md")
	if err != nil || len(pages) == 0 {
		t.Fatalf("no docs found: %v", err)
	}
	objects := 0
	for _, page := range pages {
		raw, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range yamlBlock.FindAllStringSubmatch(string(raw), -1) {
			for _, doc := range strings.Split(m[1], "\n---\n") {
				var meta struct {
					APIVersion string `json:"apiVersion"`
					Kind       string `json:"kind"`
				}
				if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
					t.Errorf("%s: not YAML: %v\n%s", page, err, doc)
					continue
				}
				if meta.APIVersion == "" {
					continue
				}
				gv, err := schema.ParseGroupVersion(meta.APIVersion)
				if err != nil {
					t.Errorf("%s: apiVersion %q: %v", page, meta.APIVersion, err)
					continue
				}
				obj, err := sch.New(gv.WithKind(meta.Kind))
				if err != nil {
					t.Errorf("%s: unknown kind %s %s: %v", page, meta.APIVersion, meta.Kind, err)
					continue
				}
				if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
					t.Errorf("%s: %s does not match its type: %v\n%s", page, meta.Kind, err, doc)
					continue
				}
				objects++
			}
		}
	}
	// The pages hold a few examples each; finding none means the parsing
	// broke, not that the docs are right.
	if objects < 15 {
		t.Errorf("decoded %d example objects from docs/*.md, want at least 15", objects)
	}
}
