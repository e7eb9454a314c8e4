package images

import (
	"cmp"
	"context"
	"fmt"
	"os"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// The one image sig-network's network-policy-api v0.3.0 conformance suite
// runs (conformance/base/manifests.yaml: every container of its server and
// client pods), which `make conformance-policy-api` loads into its lab.
const (
	PolicyAPIAgnhostRef = "registry.k8s.io/e2e-test-images/agnhost:2.45"
	// PolicyAPIAgnhostTar is the tarball of PolicyAPIAgnhostRef inside
	// Options.Out; `lace-lab load` imports it (neither up nor the e2e
	// runner does: it is no e2e-*.tar).
	PolicyAPIAgnhostTar = "policy-api-agnhost.tar"
)

// PolicyAPIAgnhostImage is the lab's agnhost image (the pinned agnhost on
// a static busybox, ENTRYPOINT ["/agnhost"], CMD ["pause"]: the suite's
// client containers run that) plus a static bash at /bin/bash: its server
// containers run `/bin/bash -c "/agnhost serve-hostname ..."`, as
// upstream's 2.45 (alpine with bash) allows. The agnhost is the pinned one
// (the tools module's, 2.56): the suite runs serve-hostname, netexec and
// connect (and porter, for SCTP only), whose flags 2.45 already had.
func PolicyAPIAgnhostImage(agnhost, busybox, bash []byte, applets []string) (v1.Image, error) {
	files := append([]File{{Path: "bin/bash", Mode: 0o755, Data: bash}}, agnhostFiles(agnhost, busybox, applets)...)
	return NewImage(dedupe(files), v1.Config{
		Entrypoint: []string{"/agnhost"},
		Cmd:        []string{"pause"},
		Env:        []string{defaultPath},
	}, Arch)
}

// BuildPolicyAPI writes PolicyAPIAgnhostTar into o.Out; it needs o.Agnhost,
// o.Busybox and o.BashStatic (default /bin/bash-static), all static.
func BuildPolicyAPI(ctx context.Context, o Options) ([]Built, error) {
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return nil, err
	}
	agnhost, err := readStatic(o.Agnhost)
	if err != nil {
		return nil, err
	}
	busybox, err := readStatic(o.Busybox)
	if err != nil {
		return nil, err
	}
	if err := checkBusybox(busybox); err != nil {
		return nil, err
	}
	bash, err := readStatic(cmp.Or(o.BashStatic, "/bin/bash-static"))
	if err != nil {
		return nil, fmt.Errorf("%w (Debian bash-static; lab/conformance/deps.sh installs it)", err)
	}
	applets, err := BusyboxApplets(ctx, o.Busybox)
	if err != nil {
		return nil, err
	}
	img, err := PolicyAPIAgnhostImage(agnhost, busybox, bash, applets)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", PolicyAPIAgnhostRef, err)
	}
	return writeBuilt(o.Out, PolicyAPIAgnhostTar, PolicyAPIAgnhostRef, img)
}
