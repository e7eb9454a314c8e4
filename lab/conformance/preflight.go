package main

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"time"

	"github.com/lace-cni/lace/lab/images"
)

// The preflight namespace and what runs in it: one netexec pod of the
// image e2e.test runs (loaded just before), behind a Service.
const (
	preflightNS  = "lace-conformance-preflight"
	preflightPod = "netexec"
	preflightSvc = "web"
)

var preflightManifest = fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata:
  name: %[1]s
---
apiVersion: v1
kind: Pod
metadata:
  name: %[2]s
  namespace: %[1]s
  labels: {app: preflight}
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: netexec
    image: %[4]s
    args: [netexec, --http-port=8080]
    readinessProbe:
      httpGet: {path: /healthz, port: 8080}
      periodSeconds: 1
---
apiVersion: v1
kind: Service
metadata:
  name: %[3]s
  namespace: %[1]s
spec:
  selector: {app: preflight}
  ports:
  - {name: http, port: 80, targetPort: 8080}
`, preflightNS, preflightPod, preflightSvc, images.E2EAgnhostRef)

// preflight checks, before a run of half an hour, what the Services specs
// take for granted of a cluster and a lab must provide beyond Lace: cluster
// DNS answers a pod (the kubernetes Service's name, and a Service's short
// name through the search path, which then answers through its VIP), and
// the API server reaches pods (pods/proxy, services/proxy: e2e's
// VerifyPods and WaitForPodsResponding). Without either, most specs fail
// one by one after their own timeouts; this fails at once and says which.
func preflight(ctx context.Context, kubectl, kubeconfig string, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, 4*time.Minute)
	defer cancel()
	k := func(stdin string, args ...string) (string, error) {
		c := exec.CommandContext(ctx, kubectl, append([]string{"--kubeconfig=" + kubeconfig}, args...)...)
		if stdin != "" {
			c.Stdin = strings.NewReader(stdin)
		}
		b, err := c.CombinedOutput()
		return strings.TrimSpace(string(b)), err
	}
	fmt.Fprintf(out, "preflight: cluster DNS and the API server's way to pods (namespace %s)\n", preflightNS)
	// What a run that was interrupted left goes first.
	if _, err := k("", "delete", "namespace", preflightNS, "--ignore-not-found", "--wait=true", "--timeout=90s"); err != nil {
		return fmt.Errorf("preflight: delete namespace %s: %w", preflightNS, err)
	}
	defer func() {
		_, _ = k("", "delete", "namespace", preflightNS, "--wait=false")
	}()
	if o, err := k("", "-n", "kube-system", "get", "service", "kube-dns", "-o", "jsonpath={.spec.clusterIP}"); err != nil {
		return fmt.Errorf("preflight: the lab has no cluster DNS (service kube-system/kube-dns: %s): bring it up with lace-lab up --dns", o)
	}
	if o, err := k(preflightManifest, "apply", "-f", "-"); err != nil {
		return fmt.Errorf("preflight: kubectl apply: %w\n%s", err, o)
	}
	// The ServiceAccount admission needs the namespace's default account,
	// which the controller manager adds a moment after the namespace.
	if o, err := k("", "-n", preflightNS, "wait", "--for=condition=Ready", "pod/"+preflightPod, "--timeout=120s"); err != nil {
		desc, _ := k("", "-n", preflightNS, "describe", "pod", preflightPod)
		return fmt.Errorf("preflight: pod %s/%s not Ready: %s\n%s", preflightNS, preflightPod, o, desc)
	}
	checks := []struct {
		what string
		args []string
		ok   func(string) bool
	}{
		{"a pod resolves kubernetes.default.svc.cluster.local (cluster DNS)",
			[]string{"-n", preflightNS, "exec", preflightPod, "--", "nslookup", "kubernetes.default.svc.cluster.local"},
			func(s string) bool { return strings.Contains(s, "10.96.0.1") }},
		{"a pod reaches http://" + preflightSvc + "/hostname (a Service's name, through the search path and its VIP)",
			[]string{"-n", preflightNS, "exec", preflightPod, "--", "curl", "-sS", "--max-time", "5", "http://" + preflightSvc + "/hostname"},
			func(s string) bool { return s == preflightPod }},
		{"the API server reaches the pod (pods/proxy)",
			[]string{"get", "--raw", "/api/v1/namespaces/" + preflightNS + "/pods/" + preflightPod + ":8080/proxy/hostname"},
			func(s string) bool { return s == preflightPod }},
		{"the API server reaches the Service's endpoint (services/proxy)",
			[]string{"get", "--raw", "/api/v1/namespaces/" + preflightNS + "/services/" + preflightSvc + ":http/proxy/hostname"},
			func(s string) bool { return s == preflightPod }},
	}
	for _, c := range checks {
		// DNS and the data plane pick a new Service up within seconds.
		deadline := time.Now().Add(45 * time.Second)
		for {
			o, err := k("", c.args...)
			if err == nil && c.ok(o) {
				fmt.Fprintf(out, "preflight: ok: %s\n", c.what)
				break
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				return fmt.Errorf("preflight: %s: kubectl %s: %v\n%s", c.what, strings.Join(c.args, " "), err, o)
			}
			time.Sleep(time.Second)
		}
	}
	return nil
}
