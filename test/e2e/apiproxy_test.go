package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
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

// TestAPIServerProxyPorterPaths: the paths of the upstream spec "Proxy
// version v1 should proxy through a service and a pod": agnhost porter on
// plain and TLS ports (<1024 too), reached through pods/proxy with and
// without a scheme and port, and through services/proxy by port name
// (http and https, named and numeric target ports), each asked several
// times at once as the spec does; services/proxy once per family (a
// single-stack IPv6 Service's endpoints are the pod's IPv6 address).
func TestAPIServerProxyPorterPaths(t *testing.T) {
	needLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "porter", Labels: map[string]string{"app": "porter"}}, Spec: corev1.PodSpec{
		NodeName:                      "n2",
		TerminationGracePeriodSeconds: ptr.To[int64](1),
		Containers: []corev1.Container{{Name: "porter", Image: agnhost, Args: []string{"porter"},
			Env: []corev1.EnvVar{
				{Name: "SERVE_PORT_80", Value: `<a href="/rewriteme">test</a>`},
				{Name: "SERVE_PORT_1080", Value: `<a href="/rewriteme">test</a>`},
				{Name: "SERVE_PORT_160", Value: "foo"}, {Name: "SERVE_PORT_162", Value: "bar"},
				{Name: "SERVE_TLS_PORT_443", Value: `<a href="/tlsrewriteme">test</a>`},
				{Name: "SERVE_TLS_PORT_460", Value: "tls baz"}, {Name: "SERVE_TLS_PORT_462", Value: "tls qux"},
			},
			Ports: []corev1.ContainerPort{{ContainerPort: 80}, {Name: "dest1", ContainerPort: 160}, {Name: "dest2", ContainerPort: 162},
				{Name: "tlsdest1", ContainerPort: 460}, {Name: "tlsdest2", ContainerPort: 462}},
			ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Port: intstr.FromInt32(80)}},
				PeriodSeconds: 1},
		}},
	}}
	startPod(t, p)
	ports := []corev1.ServicePort{
		{Name: "portname1", Port: 80, TargetPort: intstr.FromString("dest1")},
		{Name: "portname2", Port: 81, TargetPort: intstr.FromInt32(162)},
		{Name: "tlsportname1", Port: 443, TargetPort: intstr.FromString("tlsdest1")},
		{Name: "tlsportname2", Port: 444, TargetPort: intstr.FromInt32(462)},
	}
	svcs := map[string]*corev1.Service{}
	for fam, policy := range map[corev1.IPFamily]corev1.IPFamilyPolicy{corev1.IPv4Protocol: corev1.IPFamilyPolicySingleStack,
		corev1.IPv6Protocol: corev1.IPFamilyPolicySingleStack} {
		name := "porter-" + strings.ToLower(string(fam))
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "porter"}, Ports: ports, IPFamilyPolicy: ptr.To(policy), IPFamilies: []corev1.IPFamily{fam}}}
		created, err := client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = client.CoreV1().Services("default").Delete(context.Background(), name, metav1.DeleteOptions{})
		})
		svcs[name] = created
	}
	pod := "/api/v1/namespaces/default/pods/"
	want := map[string]string{
		pod + "porter/proxy/":           `<a href="` + pod + `porter/proxy/rewriteme">test</a>`,
		pod + "porter:1080/proxy/":      `<a href="` + pod + `porter:1080/proxy/rewriteme">test</a>`,
		pod + "http:porter:1080/proxy/": `<a href="` + pod + `http:porter:1080/proxy/rewriteme">test</a>`,
		pod + "porter:160/proxy/":       "foo",
		pod + "http:porter:162/proxy/":  "bar",
		pod + "https:porter:443/proxy/": `<a href="` + pod + `https:porter:443/proxy/tlsrewriteme">test</a>`,
		pod + "https:porter:460/proxy/": "tls baz",
		pod + "https:porter:462/proxy/": "tls qux",
	}
	for name := range svcs {
		s := "/api/v1/namespaces/default/services/"
		want[s+name+":portname1/proxy/"] = "foo"
		want[s+"http:"+name+":portname2/proxy/"] = "bar"
		want[s+"https:"+name+":tlsportname1/proxy/"] = "tls baz"
		want[s+"https:"+name+":tlsportname2/proxy/"] = "tls qux"
	}
	// The Services' endpoints first (the spec waits for them too).
	eventually(t, time.Minute, "services/proxy of both families answers", func() error {
		for name := range svcs {
			path := "/api/v1/namespaces/default/services/" + name + ":portname1/proxy/"
			if b, err := client.CoreV1().RESTClient().Get().AbsPath(path).DoRaw(ctx); err != nil || string(b) != "foo" {
				return fmt.Errorf("%s: %q, %v", path, b, err)
			}
		}
		return nil
	})
	var mu sync.Mutex
	var errs []string
	var wg sync.WaitGroup
	for i := range 3 {
		for path, body := range want {
			wg.Add(1)
			go func() {
				defer wg.Done()
				b, err := client.CoreV1().RESTClient().Get().AbsPath(path).DoRaw(ctx)
				if err != nil || string(b) != body {
					mu.Lock()
					errs = append(errs, fmt.Sprintf("%d: %s: %q, %v; want %q", i, path, b, err, body))
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	slices.Sort(errs)
	for _, e := range errs {
		t.Error(e)
	}
}
