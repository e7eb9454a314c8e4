package images

import (
	"context"
	"fmt"
	"os"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// The lab's cluster DNS (on by default in lace-lab up): CoreDNS under the reference
// kubeadm 1.34 deploys, so that the manifest is kubeadm's.
const (
	CoreDNSRef = "registry.k8s.io/coredns/coredns:v1.12.1"
	// CoreDNSTar is the tarball of CoreDNSRef inside Options.Out. `make
	// images` does not build it (it has a module and a compile of its own);
	// `make coredns` does, and a lab with DNS imports it.
	CoreDNSTar = "coredns.tar"
)

// CoreDNSImage is upstream's image as far as a cluster sees it: the static
// binary at /coredns, ENTRYPOINT ["/coredns"]. Upstream adds the CA bundle
// (only its forward-over-TLS and cloud plugins read it; the lab's Corefile
// uses neither) and runs as nonroot with cap_net_bind_service set on the
// file; a layer here carries no xattrs, so the image runs as root, which
// binds :53 with the NET_BIND_SERVICE the manifest keeps.
func CoreDNSImage(coredns []byte) (v1.Image, error) {
	return NewImage([]File{{Path: "coredns", Mode: 0o755, Data: coredns}}, v1.Config{
		Entrypoint: []string{"/coredns"},
		Env:        []string{defaultPath},
	}, Arch)
}

// BuildCoreDNS writes CoreDNSTar into o.Out from the static binary o.CoreDNS.
func BuildCoreDNS(_ context.Context, o Options) ([]Built, error) {
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return nil, err
	}
	bin, err := readStatic(o.CoreDNS)
	if err != nil {
		return nil, err
	}
	img, err := CoreDNSImage(bin)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", CoreDNSRef, err)
	}
	return writeBuilt(o.Out, CoreDNSTar, CoreDNSRef, img)
}
