package lab_test

import (
	"os/exec"
	"strings"
	"testing"
)

// The product: the programs a cluster runs and the tool its users run.
var productCommands = []string{"../cmd/lace-agent", "../cmd/lace-cni", "../cmd/lace-controller", "../cmd/lacectl"}

// TestProductNeverImportsTheLab: no package the product's programs are
// built from lives under lab/ (the lab, its control plane, images, bench,
// conformance runner): the lab sits beside the product and may import it,
// never the other way round.
func TestProductNeverImportsTheLab(t *testing.T) {
	args := append([]string{"list", "-deps", "-f", "{{.ImportPath}}"}, productCommands...)
	out, err := exec.Command("go", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	const lab = "github.com/lace-cni/lace/lab"
	n := 0
	for _, p := range strings.Fields(string(out)) {
		if strings.HasPrefix(p, "github.com/lace-cni/lace/") {
			n++
		}
		if p == lab || strings.HasPrefix(p, lab+"/") {
			t.Errorf("the product imports %s", p)
		}
	}
	if n < len(productCommands) {
		t.Fatalf("go list named %d of the module's packages, want at least the %d commands", n, len(productCommands))
	}
}
