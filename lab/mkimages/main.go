// Command mkimages builds the lab's container images (agnhost, pause, Lace)
// as image tarballs that `ctr images import` loads under their full names.
// `make images` runs it; see package lab/images. With --e2e it builds
// instead the images the upstream e2e.test asks for beyond those
// (`make conformance`: agnhost under e2e.test's tag, with curl, nc, ss and
// bash from the machine); with --coredns, the lab's cluster DNS image
// (`make coredns`: lace-lab up --dns imports it); with --policy-api, the
// agnhost image network-policy-api's conformance suite runs (`make
// conformance-policy-api`).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/lace-cni/lace/lab/images"
)

func main() {
	var o images.Options
	flag.StringVar(&o.Out, "out", "bin/images", "directory for agnhost.tar, pause.tar and lace.tar")
	flag.StringVar(&o.Agnhost, "agnhost", "", "static agnhost binary (make k8s-bins builds one)")
	flag.StringVar(&o.Busybox, "busybox", "/bin/busybox", "static busybox (Debian busybox-static)")
	flag.StringVar(&o.BashStatic, "bash-static", "/bin/bash-static", "static bash (Debian bash-static), the e2e busybox image's /bin/sh")
	flag.StringVar(&o.PauseSrc, "pause-src", "", "directory holding upstream pause.c (k8s.io/kubernetes build/pause/linux)")
	flag.StringVar(&o.LaceBin, "lace-bin", "", "directory holding static lace-agent, lace-controller, lace-cni and lacectl")
	flag.StringVar(&o.LaceTag, "lace-tag", "dev", "tag of "+images.LaceRepo)
	e2e := flag.Bool("e2e", false, "build only the images e2e.test asks for: "+images.E2EAgnhostTar+" ("+images.E2EAgnhostRef+"; needs --agnhost) and, with --k8s-src and --e2e-bin, busybox, jessie-dnsutils, nginx, httpd and the rest (e2e-*.tar)")
	flag.StringVar(&o.CoreDNS, "coredns", "", "build only "+images.CoreDNSTar+" ("+images.CoreDNSRef+") from this static coredns binary; with --e2e, put it into the e2e agnhost image as /coredns")
	flag.StringVar(&o.K8sSrc, "k8s-src", "", "with --e2e: the pinned k8s.io/kubernetes module directory (pause.c, kitten and nautilus pages)")
	flag.StringVar(&o.E2EBin, "e2e-bin", "", "with --e2e: directory holding static regression-issue-74839, nonewprivs, sample-apiserver and etcd-static")
	policyAPI := flag.Bool("policy-api", false, "build only "+images.PolicyAPIAgnhostTar+" ("+images.PolicyAPIAgnhostRef+", network-policy-api's conformance suite; needs --agnhost)")
	flag.Parse()
	build := images.Build
	if *policyAPI {
		build = images.BuildPolicyAPI
		if o.Agnhost == "" {
			fmt.Fprintln(os.Stderr, "mkimages: --policy-api needs --agnhost")
			os.Exit(2)
		}
	} else if *e2e {
		build = images.BuildE2E
		if o.Agnhost == "" || (o.K8sSrc == "") != (o.E2EBin == "") {
			fmt.Fprintln(os.Stderr, "mkimages: --e2e needs --agnhost, and --k8s-src and --e2e-bin together")
			os.Exit(2)
		}
	} else if o.CoreDNS != "" {
		build = images.BuildCoreDNS
	} else if o.Agnhost == "" || o.PauseSrc == "" || o.LaceBin == "" {
		fmt.Fprintln(os.Stderr, "mkimages: --agnhost, --pause-src and --lace-bin are required")
		flag.Usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, build, o); err != nil {
		fmt.Fprintln(os.Stderr, "mkimages:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, build func(context.Context, images.Options) ([]images.Built, error), o images.Options) error {
	built, err := build(ctx, o)
	if err != nil {
		return err
	}
	for _, b := range built {
		fmt.Printf("%-48s %s  %5.1f MiB  %s\n", b.Ref, b.Digest.Hex[:12], float64(b.Size)/(1<<20), b.Path)
	}
	return nil
}
