package controlplane

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"path/filepath"
	"time"
)

// The aggregation layer's front proxy (kubeadm's front-proxy-ca and
// front-proxy-client): the API server proxies a request for an aggregated
// API (an APIService backed by a Service) with this client certificate and
// the caller's identity in X-Remote-* headers. The extension API server
// trusts those headers only from a certificate of the requestheader CA
// that the API server publishes in kube-system/extension-apiserver-
// authentication; without it every proxied request is anonymous and gets
// 403, and the APIService never becomes Available. A CA of its own, as
// kubeadm makes, so that no other client certificate of the cluster CA can
// assert an identity in headers.
const (
	FrontProxyCACert     = "front-proxy-ca.crt"
	FrontProxyCAKey      = "front-proxy-ca.key"
	FrontProxyClientCert = "front-proxy-client.crt"
	FrontProxyClientKey  = "front-proxy-client.key"
	FrontProxyClientName = "front-proxy-client"
)

// FrontProxyArgs are the kube-apiserver flags of the aggregation layer
// (kubeadm's), for the files IssueFrontProxy writes under dir.
func FrontProxyArgs(dir string) []string {
	return []string{
		"--requestheader-client-ca-file=" + filepath.Join(dir, FrontProxyCACert),
		"--requestheader-allowed-names=" + FrontProxyClientName,
		"--requestheader-username-headers=X-Remote-User",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--proxy-client-cert-file=" + filepath.Join(dir, FrontProxyClientCert),
		"--proxy-client-key-file=" + filepath.Join(dir, FrontProxyClientKey),
	}
}

// IssueFrontProxy creates the front-proxy CA and its client certificate
// under p.Dir (the names above).
func (p *PKI) IssueFrontProxy() error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generate front-proxy CA key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "lace-front-proxy-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return fmt.Errorf("sign front-proxy CA: %w", err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return fmt.Errorf("parse front-proxy CA: %w", err)
	}
	if err := writeCert(filepath.Join(p.Dir, FrontProxyCACert), der); err != nil {
		return err
	}
	if err := writeECKey(filepath.Join(p.Dir, FrontProxyCAKey), key); err != nil {
		return err
	}
	fp := &PKI{Dir: p.Dir, ca: ca, caKey: key}
	return fp.Issue(filepath.Join(p.Dir, FrontProxyClientCert), filepath.Join(p.Dir, FrontProxyClientKey),
		FrontProxyClientName, nil, nil, nil, false)
}
