package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// startPod creates pod in default and waits until it is Ready; it goes at
// the end of the test.
func startPod(t *testing.T, p *corev1.Pod) *corev1.Pod {
	t.Helper()
	if _, err := client.CoreV1().Pods("default").Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.CoreV1().Pods("default").Delete(context.Background(), p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	})
	return waitPodReady(t, "default", p.Name)
}

// TestAPIServerProxiesToPods: the API server reaches pods (the pods/proxy
// and services/proxy subresources, which kubectl proxy, dashboards and the
// upstream e2e suite use) through the lab's egress proxy, on whichever
// node the pod runs.
func TestAPIServerProxiesToPods(t *testing.T) {
	needLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var names []string
	for _, node := range []string{"n1", "n3"} {
		p := netexecPod("proxied-"+node, node)
		p.Labels["app"] = "proxied"
		startPod(t, p)
		names = append(names, p.Name)
		b, err := client.CoreV1().Pods("default").ProxyGet("http", p.Name, "8080", "hostname", nil).DoRaw(ctx)
		if err != nil || strings.TrimSpace(string(b)) != p.Name {
			t.Errorf("pods/proxy to %s on %s: %q, %v; want its hostname", p.Name, node, b, err)
		}
	}
	svc := dualStackService(t, "proxied", "proxied", nil)
	waitEndpoints(t, svc, 2)
	b, err := client.CoreV1().Services("default").ProxyGet("http", svc.Name, "http", "hostname", nil).DoRaw(ctx)
	if err != nil || !slices.Contains(names, strings.TrimSpace(string(b))) {
		t.Errorf("services/proxy to %s: %q, %v; want one of %v", svc.Name, b, err, names)
	}
	// kubectl's way, as the upstream suite's helpers ask.
	out, err := kubectl(ctx, "get", "--raw", "/api/v1/namespaces/default/pods/"+names[0]+":8080/proxy/hostname")
	if err != nil || strings.TrimSpace(out) != names[0] {
		t.Errorf("kubectl get --raw .../pods/%s:8080/proxy/hostname: %q, %v", names[0], out, err)
	}
}
