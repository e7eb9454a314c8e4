package controlplane

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
