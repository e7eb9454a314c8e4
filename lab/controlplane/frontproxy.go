package controlplane

import (
	"path/filepath"
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
	ca, key, err := newCA("lace-front-proxy-ca", filepath.Join(p.Dir, FrontProxyCACert), filepath.Join(p.Dir, FrontProxyCAKey))
	if err != nil {
		return err
	}
	fp := &PKI{Dir: p.Dir, ca: ca, caKey: key}
	return fp.Issue(filepath.Join(p.Dir, FrontProxyClientCert), filepath.Join(p.Dir, FrontProxyClientKey),
		FrontProxyClientName, nil, nil, nil, false)
}
