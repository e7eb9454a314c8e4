package datapath

import (
	"regexp"
	"strconv"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/lace-cni/lace/internal/testutil"
)

// verifierHeadroom is the share of the kernel's 1M-instruction verifier
// limit a program may use: past it, the next feature added to that program
// is the one that stops it from loading, on some kernel, in production.
// This fails while there is still room to split the program.
const verifierHeadroom = 900_000

// TestVerifierHeadroom loads every program on its own and checks how much
// of the verifier's budget it takes (from_pod walks every pending-map and
// fragment branch, so it grows fastest).
func TestVerifierHeadroom(t *testing.T) {
	testutil.SkipUnit(t, "root (loads every program into the kernel)")
	for name, load := range map[string]func() (*ebpf.CollectionSpec, error){"pod": loadPod, "underlay": loadUnderlay, "sock": loadSock, "l2": loadL2} {
		spec, err := load()
		if err != nil {
			t.Fatal(err)
		}
		for pn, ps := range spec.Programs {
			ps := ps.Copy()
			cs := spec.Copy()
			for mn := range cs.Maps {
				cs.Maps[mn].Pinning = 0
			}
			cs.Programs = map[string]*ebpf.ProgramSpec{pn: ps}
			coll, err := ebpf.NewCollectionWithOptions(cs, ebpf.CollectionOptions{Programs: ebpf.ProgramOptions{LogLevel: ebpf.LogLevelStats}})
			if err != nil {
				t.Errorf("%s/%s: %v", name, pn, verifierDetail(err))
				continue
			}
			m := regexp.MustCompile(`processed (\d+) insns`).FindStringSubmatch(coll.Programs[pn].VerifierLog)
			coll.Close()
			if m == nil {
				t.Errorf("%s/%s: no instruction count in the verifier log", name, pn)
				continue
			}
			n, _ := strconv.Atoi(m[1])
			t.Logf("%s/%s: %d instructions processed", name, pn, n)
			if n > verifierHeadroom {
				t.Errorf("%s/%s: the verifier processed %d instructions, over %d: split the program before it stops loading", name, pn, n, verifierHeadroom)
			}
		}
	}
}
