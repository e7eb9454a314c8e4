package model_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestModelIsPure: the model computes desired state from API objects and
// nothing else; it must not reach the kernel, even indirectly.
func TestModelIsPure(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/lace-cni/lace/internal/model/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, bad := range []string{"github.com/cilium/ebpf", "github.com/vishvananda/", "github.com/lace-cni/lace/internal/datapath",
			"github.com/lace-cni/lace/internal/netutil", "github.com/lace-cni/lace/internal/podnet"} {
			if strings.HasPrefix(dep, bad) {
				t.Errorf("internal/model depends on %s", dep)
			}
		}
	}
}
