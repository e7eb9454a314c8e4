package controlplane

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
)

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode(data)
	if b == nil {
		t.Fatalf("%s: no PEM", path)
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestFrontProxy: the API server's proxy client certificate is
// front-proxy-client of a CA of its own (not the cluster CA, whose other
// client certificates must not assert identities in X-Remote-* headers),
// and the flags point at those files.
func TestFrontProxy(t *testing.T) {
	dir := t.TempDir()
	p, err := NewPKI(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.IssueFrontProxy(); err != nil {
		t.Fatal(err)
	}
	client := readCert(t, filepath.Join(dir, FrontProxyClientCert))
	if client.Subject.CommonName != FrontProxyClientName {
		t.Errorf("CN %q, want %q", client.Subject.CommonName, FrontProxyClientName)
	}
	verify := func(caPath string) error {
		pool := x509.NewCertPool()
		pool.AddCert(readCert(t, caPath))
		_, err := client.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
		return err
	}
	if err := verify(filepath.Join(dir, FrontProxyCACert)); err != nil {
		t.Errorf("front-proxy-client does not verify against the front-proxy CA: %v", err)
	}
	if err := verify(p.CACert); err == nil {
		t.Error("front-proxy-client verifies against the cluster CA: want a CA of its own")
	}
	if _, err := os.Stat(filepath.Join(dir, FrontProxyClientKey)); err != nil {
		t.Error(err)
	}
	args := strings.Join(FrontProxyArgs(dir), " ")
	for _, want := range []string{
		"--requestheader-client-ca-file=" + filepath.Join(dir, FrontProxyCACert),
		"--requestheader-allowed-names=front-proxy-client",
		"--proxy-client-cert-file=" + filepath.Join(dir, FrontProxyClientCert),
		"--proxy-client-key-file=" + filepath.Join(dir, FrontProxyClientKey),
	} {
		if !strings.Contains(args, want) {
			t.Errorf("args %q lack %q", args, want)
		}
	}
}

// hostAddr is an address of this machine that Endpoints accept (not
// loopback nor link-local): the API server resolves an APIService's
// Service to its endpoints (--enable-aggregator-routing) and dials them.
// The packets stay on the machine.
func hostAddr() string {
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && n.IP.IsGlobalUnicast() {
			return n.IP.String()
		}
	}
	return ""
}

// TestAggregatedAPIServer: the upstream Aggregator [Conformance] spec's
// path without a cluster network. k8s.io/sample-apiserver (the e2e image's
// program, make e2e-image-bins) runs on this machine behind an APIService;
// the API server proxies a list of flunders to it, which the
// sample-apiserver serves only when it trusts the front proxy's client
// certificate (without the front proxy: 403, the APIService stays
// unavailable and the list answers 503).
func TestAggregatedAPIServer(t *testing.T) {
	bin := DefaultBinDir()
	if m := MissingBinaries(bin, "etcd", "kube-apiserver", "sample-apiserver"); len(m) > 0 {
		msg := fmt.Sprintf("missing %v in %s: run 'make k8s-bins e2e-image-bins'", m, bin)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	ip := hostAddr()
	if ip == "" {
		t.Skip("no non-loopback IPv4 address on this machine for the Endpoints")
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cp, err := Start(ctx, Options{BinDir: bin, Dir: dir, ExtraAPIServerArgs: []string{"--enable-aggregator-routing=true"}})
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Stop()
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	sa := exec.CommandContext(ctx, filepath.Join(bin, "sample-apiserver"),
		"--etcd-servers="+cp.EtcdURL, "--secure-port="+strconv.Itoa(port), "--bind-address="+ip,
		"--cert-dir="+filepath.Join(dir, "sample-certs"),
		"--kubeconfig="+cp.AdminKubeconfig, "--authentication-kubeconfig="+cp.AdminKubeconfig,
		"--authorization-kubeconfig="+cp.AdminKubeconfig)
	logPath := filepath.Join(dir, "sample-apiserver.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	sa.Stdout, sa.Stderr = logf, logf
	if err := sa.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = sa.Process.Kill()
		_ = sa.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			if len(b) > 4000 {
				b = b[len(b)-4000:]
			}
			t.Logf("sample-apiserver log (tail):\n%s", b)
		}
	}()
	rc := kubernetes.NewForConfigOrDie(cp.RESTConfig()).Discovery().RESTClient()
	p := strconv.Itoa(port)
	for _, o := range []struct{ path, body string }{
		{"/api/v1/namespaces/default/services", `{"apiVersion":"v1","kind":"Service","metadata":{"name":"sample"},"spec":{"ports":[{"port":443,"targetPort":` + p + `}]}}`},
		{"/apis/discovery.k8s.io/v1/namespaces/default/endpointslices", `{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":"sample-1","labels":{"kubernetes.io/service-name":"sample"}},"addressType":"IPv4","endpoints":[{"addresses":["` + ip + `"]}],"ports":[{"port":` + p + `,"protocol":"TCP"}]}`},
		{"/apis/apiregistration.k8s.io/v1/apiservices", `{"apiVersion":"apiregistration.k8s.io/v1","kind":"APIService","metadata":{"name":"v1alpha1.wardle.example.com"},"spec":{"group":"wardle.example.com","version":"v1alpha1","service":{"namespace":"default","name":"sample","port":443},"insecureSkipTLSVerify":true,"groupPriorityMinimum":2000,"versionPriority":200}}`},
	} {
		if _, err := rc.Post().AbsPath(o.path).SetHeader("Content-Type", "application/json").Body([]byte(o.body)).DoRaw(ctx); err != nil {
			t.Fatalf("create %s: %v", o.path, err)
		}
	}
	var last error
	for start := time.Now(); time.Since(start) < 60*time.Second; time.Sleep(500 * time.Millisecond) {
		b, err := rc.Get().AbsPath("/apis/wardle.example.com/v1alpha1/namespaces/default/flunders").DoRaw(ctx)
		if err == nil {
			if !strings.Contains(string(b), `"kind":"FlunderList"`) {
				t.Fatalf("flunders: %s", b)
			}
			return
		}
		last = err
	}
	st, _ := rc.Get().AbsPath("/apis/apiregistration.k8s.io/v1/apiservices/v1alpha1.wardle.example.com/status").DoRaw(ctx)
	t.Fatalf("the API server never listed flunders through the sample-apiserver: %v\nAPIService: %s", last, st)
}
