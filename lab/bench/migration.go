package main

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/model/ipam"
	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/lab"
	"github.com/lace-cni/lace/lab/vmsim"
)

// peerMigrationOutage is the interruption OVN-Kubernetes (layer-2
// UserDefinedNetworks) and Kube-OVN (activation-strategy=rarp) publish for
// a live migration, TCP intact; migrationTarget is Lace's.
const (
	peerMigrationOutage = 500 * time.Millisecond
	migrationTarget     = 200 * time.Millisecond
)

// benchMigration measures a live migration's outage on an l2 network: a
// VM (lab/vmsim: a guest namespace behind its virt-launcher pod's bridge
// binding) streams TCP to a pod on the third node, which pings it every
// 10 ms, while the VM's NIC moves between its pods on the first two nodes, in
// turns with QEMU's announcement (RARP) and with the announcement lost
// (its first frame moves it). The outage is the longest silence of each.
func benchMigration(ctx context.Context, name string, rounds int) error {
	cs, c, err := labClient(name)
	if err != nil {
		return err
	}
	kubectl := func(stdin string, args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, filepath.Join(c.K8sBinDir, "kubectl"), args...)
		cmd.Env = append(cmd.Environ(), "KUBECONFIG="+c.Kubeconfig())
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("kubectl %v: %v: %s", args, err, out)
		}
		return string(out), nil
	}
	gv := lacev1.GroupVersion.String()
	objs := fmt.Sprintf(`{"apiVersion":%q,"kind":"Network","metadata":{"name":"bench-mig"},"spec":{"type":"l2","ipv4Subnet":{"prefix":"10.72.0.0/24"}}}
{"apiVersion":%q,"kind":"NetworkBindingPolicy","metadata":{"name":"bench-mig"},"spec":{"network":"bench-mig","priority":5,"matchKind":"Pod","selector":{"matchLabels":{"bench-net":"mig"}}}}
{"apiVersion":"k8s.cni.cncf.io/v1alpha1","kind":"IPAMClaim","metadata":{"name":"bench-vm","namespace":"default"},"spec":{"network":"bench-mig","interface":"eth0"}}`, gv, gv)
	if _, err := kubectl(objs, "apply", "-f", "-"); err != nil {
		return err
	}
	defer func() {
		_, _ = kubectl("", "delete", "ipamclaim", "bench-vm", "--ignore-not-found")
		_, _ = kubectl("", "delete", "networkbindingpolicy", "bench-mig", "--ignore-not-found")
		_, _ = kubectl("", "delete", "network", "bench-mig", "--ignore-not-found")
	}()
	pods := []struct{ name, node, claim string }{
		{"bench-vm-src", c.NodeName(1), "bench-vm"}, {"bench-vm-tgt", c.NodeName(2), "bench-vm"}, {"bench-vm-peer", c.NodeName(3), ""},
	}
	nsOf := map[string]string{}
	ipOf := map[string]netip.Addr{}
	for _, p := range pods {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.name, Labels: map[string]string{"bench-net": "mig"}},
			Spec: corev1.PodSpec{NodeName: p.node, TerminationGracePeriodSeconds: ptr.To[int64](1),
				Containers: []corev1.Container{{Name: "pause", Image: "registry.k8s.io/pause:3.10"}}}}
		if p.claim != "" {
			pod.Annotations = map[string]string{lacev1.AnnotationOVNPrimaryUDNIPAMClaim: p.claim}
		}
		if _, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			return err
		}
		defer func() {
			_ = cs.CoreV1().Pods("default").Delete(context.Background(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
		}()
		// The target starts once the VM runs at the source (KubeVirt's
		// order), so that the source holds the MAC.
		if err := waitFor(ctx, 2*time.Minute, "pod "+p.name+" running", func() error {
			got, err := cs.CoreV1().Pods("default").Get(ctx, p.name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if got.Status.Phase != corev1.PodRunning || got.Status.PodIP == "" {
				return fmt.Errorf("phase %s", got.Status.Phase)
			}
			ipOf[p.name] = netip.MustParseAddr(got.Status.PodIP)
			nsOf[p.name], err = lab.PodNetNS(ctx, c, "default", p.name)
			return err
		}); err != nil {
			return err
		}
	}
	eth0, err := netutil.GetLink(nsOf["bench-vm-src"], "eth0")
	if err != nil {
		return err
	}
	info := eth0.MAC // the VM's, from its claim
	mtu, err := vmsim.Bind(nsOf["bench-vm-src"])
	if err != nil {
		return err
	}
	if _, err := vmsim.Bind(nsOf["bench-vm-tgt"]); err != nil {
		return err
	}
	g, err := vmsim.Start(nsOf["bench-vm-src"], info, mtu, netip.PrefixFrom(ipOf["bench-vm-src"], 24))
	if err != nil {
		return err
	}
	defer g.Close()
	if err := g.Plug(nsOf["bench-vm-tgt"]); err != nil {
		return err
	}
	var pr *vmsim.Probe
	if err := waitFor(ctx, 30*time.Second, "the VM's stream to the peer", func() error {
		pr, err = vmsim.StartProbe(g, nsOf["bench-vm-peer"], ipOf["bench-vm-peer"], ipOf["bench-vm-src"], 9972)
		return err
	}); err != nil {
		return err
	}
	defer pr.Stop()
	fdb := ipam.FDBEntryName("bench-mig", info)
	at := []string{c.NodeName(1), c.NodeName(2)}
	pod := []string{nsOf["bench-vm-src"], nsOf["bench-vm-tgt"]}
	var announced, lost [2][]time.Duration // ping, stream
	for i := range 2 * rounds {
		from, to := i%2, (i+1)%2
		// Settled: the MAC published at from, to standing by everywhere.
		if err := waitFor(ctx, time.Minute, fmt.Sprintf("the VM at %s, %s standing by", at[from], at[to]), func() error {
			out, err := kubectl("", "get", "fdb", fdb, "-o", "jsonpath={.spec.node},{.spec.standby}")
			if err != nil {
				return err
			}
			if out != at[from]+","+at[to] {
				return fmt.Errorf("FDBEntry at,standby %q", out)
			}
			for n := 1; n <= 3; n++ {
				if err := standbyProgrammed(c, c.NodeName(n), info); err != nil {
					return err
				}
			}
			if r, s := pr.Arrived(time.Now().Add(-time.Second)); r < 50 || s == 0 {
				return fmt.Errorf("the probe: %d replies, %d reads in the last second", r, s)
			}
			return nil
		}); err != nil {
			return err
		}
		announce := i%2 == 0
		t0 := time.Now()
		if err := g.Migrate(pod[to], announce); err != nil {
			return err
		}
		var back time.Time
		if err := waitFor(ctx, 30*time.Second, "the probe through the migrated VM", func() error {
			if back.IsZero() {
				if r, s := pr.Arrived(t0); r == 0 || s == 0 {
					return fmt.Errorf("%d replies, %d reads", r, s)
				}
				back = time.Now()
			}
			if time.Since(back) < time.Second {
				return fmt.Errorf("flowing for %v", time.Since(back))
			}
			return nil
		}); err != nil {
			return err
		}
		if err := pr.Err(); err != nil {
			return fmt.Errorf("migration %d: the stream broke: %w", i+1, err)
		}
		ping, stream := pr.Outage(t0.Add(-100*time.Millisecond), time.Now())
		if announce {
			announced[0], announced[1] = append(announced[0], ping), append(announced[1], stream)
		} else {
			lost[0], lost[1] = append(lost[0], ping), append(lost[1], stream)
		}
	}
	fmt.Printf("live migration on an l2 network (a guest namespace behind KubeVirt's bridge binding, its NIC switched between pods on two nodes; a TCP stream from it and a %v ping to it from a pod on a third node; %d migrations each way, no TCP reset; outage = the longest silence, one ping interval included)\n",
		vmsim.PingInterval, rounds)
	fmt.Printf("peer = the interruption OVN-Kubernetes and Kube-OVN publish (%v, TCP intact); target <= %v\n", peerMigrationOutage, migrationTarget)
	tab := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tab, "migration\toutage, ping (median)\tmax\tratio to peer\toutage, stream (median)\tmax\t")
	for _, r := range []struct {
		what string
		d    [2][]time.Duration
	}{{"with QEMU's RARP", announced}, {"announcement lost", lost}} {
		pm, px, sm, sx := quantile(r.d[0], 50), slices.Max(r.d[0]), quantile(r.d[1], 50), slices.Max(r.d[1])
		fmt.Fprintf(tab, "%s\t%s\t%s\t%.2f\t%s\t%s\t\n", r.what, ms(pm), ms(px), float64(px)/float64(peerMigrationOutage), ms(sm), ms(sx))
	}
	tab.Flush()
	fmt.Println()
	return nil
}

// standbyProgrammed tells (nil) whether node's data plane holds mac with
// a standby.
func standbyProgrammed(c lab.Config, node string, mac net.HardwareAddr) error {
	dp, err := datapath.Load(filepath.Join(c.NodeRoot(node), "sys/fs/bpf/lace"))
	if err != nil {
		return fmt.Errorf("open the data plane of %s: %w", node, err)
	}
	defer dp.Close()
	fs, err := dp.FDB()
	if err != nil {
		return err
	}
	for _, f := range fs {
		if f.MAC.String() == mac.String() && (f.StandbyIfIndex != 0 || f.StandbySID.IsValid()) {
			return nil
		}
	}
	return fmt.Errorf("%s holds no standby of %s", node, mac)
}

// waitFor polls f until it returns nil or timeout passes.
func waitFor(ctx context.Context, timeout time.Duration, what string, f func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
