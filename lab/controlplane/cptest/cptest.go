// Package cptest starts a real etcd and kube-apiserver for a test, with the
// lace-cni.io CRDs installed, and tears them down when the test ends.
package cptest

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lace-cni/lace/internal/testutil"
	"github.com/lace-cni/lace/lab/controlplane"
	"github.com/lace-cni/lace/pkg/scheme"
)

// Env is a running control plane for one test.
type Env struct {
	CP     *controlplane.ControlPlane
	Config *rest.Config
	Client client.Client
}

// Start starts etcd and kube-apiserver, installs the CRDs and returns a
// client. Without the binaries it skips, except under CI where a missing
// binary is a failure.
func Start(t testing.TB) *Env {
	t.Helper()
	testutil.SkipUnit(t, "a control plane (etcd, kube-apiserver)")
	bin := controlplane.DefaultBinDir()
	if m := controlplane.MissingBinaries(bin, "etcd", "kube-apiserver"); len(m) > 0 {
		msg := "missing " + strings.Join(m, ", ") + " in " + bin + ": run 'make k8s-bins'"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	dir, err := os.MkdirTemp("", "lace-cptest-")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cp, err := controlplane.Start(ctx, controlplane.Options{BinDir: bin, Dir: dir})
	if err != nil {
		os.RemoveAll(dir)
		t.Fatalf("start control plane: %v", err)
	}
	t.Cleanup(func() {
		cp.Stop()
		if t.Failed() {
			t.Logf("control plane logs kept in %s", filepath.Join(dir, "logs"))
			return
		}
		os.RemoveAll(dir)
	})
	cfg := cp.RESTConfig()
	if err := controlplane.InstallCRDs(ctx, cfg); err != nil {
		t.Fatalf("install CRDs: %v", err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	return &Env{CP: cp, Config: cfg, Client: c}
}
