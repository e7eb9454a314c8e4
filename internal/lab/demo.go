package lab

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/pkg/scheme"
)

// demoNetworks are the two networks of the demo topology.
var demoNetworks = []struct{ name, v4, v6 string }{
	{"red", "10.10.0.0/16", "fd00:10::/48"},
	{"blue", "10.20.0.0/16", "fd00:20::/48"},
}

// Demo applies a demo topology to a running lab (two l3 networks, a netexec
// pod of each on every node) and prints a reachability matrix measured by
// real requests sent from inside each pod.
func Demo(ctx context.Context, c Config, out io.Writer) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig())
	if err != nil {
		return fmt.Errorf("lab %s kubeconfig: %w", c.Name, err)
	}
	cl, err := client.New(cfg, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		return err
	}
	var objs []client.Object
	for _, n := range demoNetworks {
		objs = append(objs,
			&lacev1.Network{ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: map[string]string{"demo": "lace"}}, Spec: lacev1.NetworkSpec{
				Type:       lacev1.NetworkTypeL3,
				IPv4Subnet: &lacev1.Subnet{Prefix: lacev1.CIDR(n.v4), HostLocalPrefixLength: ptr.To[int32](24)},
				IPv6Subnet: &lacev1.Subnet{Prefix: lacev1.CIDR(n.v6), HostLocalPrefixLength: ptr.To[int32](64)},
			}},
			&lacev1.NetworkBindingPolicy{ObjectMeta: metav1.ObjectMeta{Name: "demo-" + n.name}, Spec: lacev1.NetworkBindingPolicySpec{
				Network: n.name, Priority: 10, MatchKind: lacev1.MatchKindPod,
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"net": n.name}},
			}})
	}
	var names []string
	for _, n := range demoNetworks {
		for i := 1; i <= c.Nodes; i++ {
			name := fmt.Sprintf("%s-%s", n.name, c.NodeName(i))
			names = append(names, name)
			objs = append(objs, demoPod(name, n.name, c.NodeName(i)))
		}
	}
	for _, o := range objs {
		if err := cl.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create %s: %w", o.GetName(), err)
		}
	}
	fmt.Fprintf(out, "demo: networks red and blue, one netexec pod of each on every node\n")
	pods := map[string]*corev1.Pod{}
	deadline := time.Now().Add(2 * time.Minute)
	for len(pods) < len(names) {
		if time.Now().After(deadline) {
			return fmt.Errorf("demo pods not ready after 2 minutes (%d of %d)", len(pods), len(names))
		}
		for _, name := range names {
			var p corev1.Pod
			if err := cl.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &p); err != nil {
				continue
			}
			for _, cond := range p.Status.Conditions {
				if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
					pods[name] = &p
				}
			}
		}
		time.Sleep(300 * time.Millisecond)
	}

	// Each pod's network namespace, as its node's runtime reports it.
	netns := map[string]string{}
	for _, name := range names {
		p, err := PodNetNS(ctx, c, pods[name].Namespace, name)
		if err != nil {
			return err
		}
		netns[name] = p
	}
	// Every cell is measured at once: isolated pairs wait out a timeout.
	type cellKey struct{ src, dst string }
	results := map[cellKey][]string{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, src := range names {
		for _, dst := range names {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var cell []string
				for _, ip := range pods[dst].Status.PodIPs {
					if reach(ctx, netns[src], netip.MustParseAddr(ip.IP), dst) {
						cell = append(cell, "ok")
					} else {
						cell = append(cell, "--")
					}
				}
				mu.Lock()
				results[cellKey{src, dst}] = cell
				mu.Unlock()
			}()
		}
	}
	wg.Wait()

	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "\nFROM \\ TO (v4/v6)")
	for _, dst := range names {
		fmt.Fprintf(tw, "\t%s", dst)
	}
	fmt.Fprintln(tw)
	for _, src := range names {
		fmt.Fprintf(tw, "%s", src)
		for _, dst := range names {
			fmt.Fprintf(tw, "\t%s", strings.Join(results[cellKey{src, dst}], "/"))
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
	fmt.Fprintln(out, "\nok: an HTTP request from the row's pod was answered by the column's pod; --: no answer (isolated).")
	return nil
}

func demoPod(name, network, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{"net": network, "demo": "lace"}},
		Spec: corev1.PodSpec{
			NodeName: node, TerminationGracePeriodSeconds: ptr.To[int64](2),
			Containers: []corev1.Container{{
				Name: "netexec", Image: "registry.k8s.io/e2e-test-images/agnhost:2.53",
				Args:  []string{"netexec", "--http-port=8080", "--udp-port=8081"},
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
					Path: "/healthz", Port: intstr.FromString("http")}}, PeriodSeconds: 1},
			}},
		},
	}
}

// reach sends GET /hostname from inside the network namespace at srcNS to
// dst:8080 and reports whether want answered.
func reach(ctx context.Context, srcNS string, dst netip.Addr, want string) bool {
	ctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancel()
	conn, err := netutil.DialContext(ctx, srcNS, "tcp", net.JoinHostPort(dst.String(), "8080"))
	if err != nil {
		return false
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(1500 * time.Millisecond))
	fmt.Fprintf(conn, "GET /hostname HTTP/1.0\r\nHost: demo\r\n\r\n")
	b, err := io.ReadAll(conn)
	if err != nil {
		return false
	}
	_, body, _ := strings.Cut(string(b), "\r\n\r\n")
	return strings.TrimSpace(body) == want
}
