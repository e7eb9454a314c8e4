package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/lab"
)

// benchL2 measures an l2 network's path across nodes beside the l3 path
// across nodes in the same run: pods of an l2 network on n1 and n2 against
// pods of the default (l3) network on the same nodes, the paths taking
// turns. A third l2 path has the sending pod's segmentation offloads off
// (TSO and GSO): every segment then crosses the data plane on its own, as
// an Ethernet frame carried whole in SRv6 must on a real NIC (the kernel
// cannot segment Ethernet-in-IPv6); that row is what a large transfer
// would cost without the IP shortcut (SID_L2_IP), which keeps GSO.
func benchL2(ctx context.Context, name string, dur time.Duration) error {
	cs, c, err := labClient(name)
	if err != nil {
		return err
	}
	kubectl := func(stdin string, args ...string) error {
		cmd := exec.CommandContext(ctx, filepath.Join(c.K8sBinDir, "kubectl"), args...)
		cmd.Env = append(cmd.Environ(), "KUBECONFIG="+c.Kubeconfig())
		cmd.Stdin = strings.NewReader(stdin)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("kubectl %v: %v: %s", args, err, out)
		}
		return nil
	}
	gv := lacev1.GroupVersion.String()
	objs := fmt.Sprintf(`{"apiVersion":%q,"kind":"Network","metadata":{"name":"bench-l2"},"spec":{"type":"l2","ipv4Subnet":{"prefix":"10.69.0.0/24"}}}
{"apiVersion":%q,"kind":"NetworkBindingPolicy","metadata":{"name":"bench-l2"},"spec":{"network":"bench-l2","priority":5,"matchKind":"Pod","selector":{"matchLabels":{"bench-net":"l2"}}}}`, gv, gv)
	if err := kubectl(objs, "apply", "-f", "-"); err != nil {
		return err
	}
	defer func() {
		_ = kubectl("", "delete", "networkbindingpolicy", "bench-l2", "--ignore-not-found")
		_ = kubectl("", "delete", "network", "bench-l2", "--ignore-not-found")
	}()
	pods := []struct {
		name, node string
		l2         bool
	}{{"l2-a", c.NodeName(1), true}, {"l2-b", c.NodeName(1), true}, {"l2-c", c.NodeName(2), true},
		{"l3-a", c.NodeName(1), false}, {"l3-c", c.NodeName(2), false}}
	for _, p := range pods {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "bench-" + p.name, Labels: map[string]string{}},
			Spec: corev1.PodSpec{NodeName: p.node, TerminationGracePeriodSeconds: ptr.To[int64](1),
				Containers: []corev1.Container{{Name: "pause", Image: "registry.k8s.io/pause:3.10"}}}}
		if p.l2 {
			pod.Labels["bench-net"] = "l2"
		}
		if _, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			return err
		}
		defer func() {
			_ = cs.CoreV1().Pods("default").Delete(context.Background(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
		}()
	}
	nsOf := map[string]string{}
	ipOf := map[string]netip.Addr{}
	deadline := time.Now().Add(2 * time.Minute)
	for len(nsOf) < len(pods) && time.Now().Before(deadline) {
		for _, p := range pods {
			n := "bench-" + p.name
			if _, ok := nsOf[n]; ok {
				continue
			}
			if pod, err := cs.CoreV1().Pods("default").Get(ctx, n, metav1.GetOptions{}); err == nil &&
				pod.Status.Phase == corev1.PodRunning && pod.Status.PodIP != "" {
				ns, err := lab.PodNetNS(ctx, c, "default", n)
				if err != nil {
					return err
				}
				nsOf[n], ipOf[n] = ns, netip.MustParseAddr(pod.Status.PodIP)
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	if len(nsOf) < len(pods) {
		return errors.New("l2 bench pods did not start")
	}
	if out, err := inNS(ctx, nsOf["bench-l2-b"], "ethtool", "-K", "eth0", "tso", "off", "gso", "off").CombinedOutput(); err != nil {
		return fmt.Errorf("offloads off in bench-l2-b: %v: %s", err, out)
	}
	l2MTU, err := linkMTU(nsOf["bench-l2-a"], "eth0")
	if err != nil {
		return err
	}
	l3MTU, err := linkMTU(nsOf["bench-l3-a"], "eth0")
	if err != nil {
		return err
	}
	paths := []struct {
		name, src, dst string
		addr           netip.Addr
	}{
		{"l3 across nodes", nsOf["bench-l3-a"], nsOf["bench-l3-c"], ipOf["bench-l3-c"]},
		{"l2 across nodes", nsOf["bench-l2-a"], nsOf["bench-l2-c"], ipOf["bench-l2-c"]},
		{"l2 across nodes, sender without TSO/GSO", nsOf["bench-l2-b"], nsOf["bench-l2-c"], ipOf["bench-l2-c"]},
	}
	for _, p := range paths {
		if _, _, _, err := requestResponse(ctx, p.src, p.dst, p.addr, 200*time.Millisecond); err != nil {
			return fmt.Errorf("%s: warm-up: %w", p.name, err)
		}
	}
	samples := make([][]result, len(paths))
	for round := range rounds {
		cpu := round % max(runtime.NumCPU(), 1)
		for k := range paths {
			i := (k + round) % len(paths)
			r, err := measurePath(ctx, paths[i].src, paths[i].dst, paths[i].addr, dur, cpu)
			if err != nil {
				return fmt.Errorf("%s: %w", paths[i].name, err)
			}
			samples[i] = append(samples[i], r)
		}
	}
	m := make([]result, len(paths))
	for i := range paths {
		m[i] = median(samples[i])
	}
	fmt.Printf("l2 networks (IPv4, l2 pod MTU %d, l3 pod MTU %d; iperf3, one TCP stream, %s; 1-byte ping-pong, %s; median of %d interleaved rounds)\n",
		l2MTU, l3MTU, dur, dur, rounds)
	fmt.Println("peer = the l3 path across the same nodes, measured in the same run")
	tab := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tab, "path\tGbit/s\tratio to l3\tp50\tratio to l3\tp99\t")
	for i, p := range paths {
		fmt.Fprintf(tab, "%s\t%.2f\t%.2f\t%s\t%.2f\t%s\t\n", p.name, m[i].gbps, m[i].gbps/m[0].gbps,
			us(m[i].p50), float64(m[i].p50)/float64(m[0].p50), us(m[i].p99))
	}
	tab.Flush()
	fmt.Println("target: l2 across nodes >= 0.6 of the l3 throughput")
	fmt.Println()
	return nil
}
