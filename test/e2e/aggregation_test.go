package e2e

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestAggregationFrontProxy: the lab's API server publishes the front
// proxy's requestheader CA and allowed names in
// kube-system/extension-apiserver-authentication, which aggregated API
// servers (the upstream Aggregator [Conformance] spec's sample-apiserver)
// read to trust the requests the API server proxies to them. Without it
// they see those requests as anonymous and answer 403
// (lab/controlplane/frontproxy.go; TestAggregatedAPIServer runs a
// sample-apiserver behind it).
func TestAggregationFrontProxy(t *testing.T) {
	needLab(t)
	cm, err := client.CoreV1().ConfigMaps("kube-system").Get(context.Background(), "extension-apiserver-authentication", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ca := cm.Data["requestheader-client-ca-file"]; !strings.Contains(ca, "BEGIN CERTIFICATE") {
		t.Errorf("requestheader-client-ca-file is %q: the API server has no front proxy (--requestheader-client-ca-file)", ca)
	}
	if names := cm.Data["requestheader-allowed-names"]; !strings.Contains(names, `"front-proxy-client"`) {
		t.Errorf("requestheader-allowed-names is %q, want [\"front-proxy-client\"]", names)
	}
	if h := cm.Data["requestheader-username-headers"]; !strings.Contains(h, "X-Remote-User") {
		t.Errorf("requestheader-username-headers is %q, want X-Remote-User", h)
	}
}
