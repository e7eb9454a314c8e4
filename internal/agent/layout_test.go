package agent_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestPartsDoNotImportEachOther: the agent's parts own their state and
// see the others only through the interfaces agent.New hands them; none
// imports another (the leaf applier aside) or the agent that wires them.
func TestPartsDoNotImportEachOther(t *testing.T) {
	const root = "github.com/lace-cni/lace/internal/agent"
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, root+"/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	parts := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if f[0] == root {
			continue
		}
		parts++
		for _, imp := range f[1:] {
			if (imp == root || strings.HasPrefix(imp, root+"/")) && imp != root+"/applier" {
				t.Errorf("%s imports %s", f[0], imp)
			}
			if f[0] == root+"/applier" && strings.HasPrefix(imp, "github.com/lace-cni/lace/") {
				t.Errorf("the applier imports %s", imp)
			}
		}
	}
	if parts < 5 {
		t.Errorf("%d parts under %s, want cni, nodesync, applier, announce, status", parts, root)
	}
}
