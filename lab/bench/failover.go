package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/model"
	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/lab"
)

// benchFailover measures the L2 failover of a LoadBalancer VIP from the
// lab's external host: the announcing node's agent is stopped, and the
// time runs from that agent's last heartbeat (its Lease's renewTime, at
// most a quarter lease duration before it died) to the first request the
// external host gets answered through the node that took over (its
// neighbour entry for the VIP holding that node's MAC, learnt from the
// gratuitous ARP). The agent is started again between rounds. MetalLB is
// not installed here (no registry): its documented behaviour is printed
// beside the figures.
func benchFailover(ctx context.Context, name, bin string, rounds int) error {
	cs, c, err := fastClient(name)
	if err != nil {
		return err
	}
	const class, svcName = "bench-l2", "bench-l2"
	first, last := netip.MustParseAddr("172.30.0.248"), netip.MustParseAddr("172.30.0.251")
	classObj := fmt.Sprintf(`{"apiVersion":%q,"kind":"LoadBalancerClass","metadata":{"name":%q},"spec":{"addresses":[%q]}}`,
		lacev1.GroupVersion.String(), class, first.String()+"-"+last.String())
	kubectl := func(stdin string, args ...string) error {
		cmd := exec.CommandContext(ctx, filepath.Join(c.K8sBinDir, "kubectl"), args...)
		cmd.Env = append(cmd.Environ(), "KUBECONFIG="+c.Kubeconfig())
		cmd.Stdin = strings.NewReader(stdin)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("kubectl %v: %v: %s", args, err, out)
		}
		return nil
	}
	if err := kubectl(classObj, "apply", "-f", "-"); err != nil {
		return err
	}
	defer func() { _ = kubectl("", "delete", "loadbalancerclass", class, "--ignore-not-found") }()
	nodes := []string{c.NodeName(1), c.NodeName(2)}
	for _, n := range nodes {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "l2-" + n, Labels: map[string]string{"app": "bench-l2"}},
			Spec: corev1.PodSpec{NodeName: n, TerminationGracePeriodSeconds: ptr.To[int64](1),
				Containers: []corev1.Container{{Name: "netexec", Image: "registry.k8s.io/e2e-test-images/agnhost:2.53",
					Args: []string{"netexec", "--http-port=8080", "--udp-port=8081"}}}}}
		if _, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			return err
		}
		defer func() {
			_ = cs.CoreV1().Pods("default").Delete(context.Background(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
		}()
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: svcName}, Spec: corev1.ServiceSpec{
		Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: ptr.To(lacev1.LoadBalancerClassPrefix + class),
		Selector: map[string]string{"app": "bench-l2"},
		Ports:    []corev1.ServicePort{{Name: "udp", Port: 81, TargetPort: intstr.FromInt32(8081), Protocol: corev1.ProtocolUDP}}}}
	if _, err := cs.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return err
	}
	defer func() {
		_ = cs.CoreV1().Services("default").Delete(context.Background(), svcName, metav1.DeleteOptions{})
	}()

	var vip netip.Addr
	ext := netutil.Path(c.NetNS("external"))
	ask := func() bool {
		ctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		conn, err := netutil.DialContext(ctx, ext, "udp", netip.AddrPortFrom(vip, 81).String())
		if err != nil {
			return false
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(300 * time.Millisecond))
		if _, err := conn.Write([]byte("hostname")); err != nil {
			return false
		}
		buf := make([]byte, 64)
		n, err := conn.Read(buf)
		return err == nil && strings.HasPrefix(string(buf[:n]), "l2-")
	}
	if err := until(ctx, time.Minute, func() bool {
		s, err := cs.CoreV1().Services("default").Get(ctx, svcName, metav1.GetOptions{})
		if err != nil {
			return false
		}
		if a := model.IngressAddrs(s); len(a) == 1 {
			vip = a[0]
		}
		return vip.IsValid() && ask()
	}); err != nil {
		return fmt.Errorf("the VIP of %s never answered: %w", svcName, err)
	}
	macs := map[string]string{}
	for _, n := range nodes {
		if macs[n], err = lab.NodeMAC(c, n); err != nil {
			return err
		}
	}
	labCmd := func(args ...string) error {
		cmd := exec.CommandContext(ctx, filepath.Join(bin, "lace-lab"), append([]string{args[0], "--name", name}, args[1:]...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("lace-lab %v: %v: %s", args, err, out)
		}
		return nil
	}

	var fromBeat, fromStop []time.Duration
	for r := 0; r < rounds; r++ {
		var old string
		if err := until(ctx, 30*time.Second, func() bool {
			who, _ := lab.Announcers(c, vip)
			if len(who) == 1 && lab.ExternalNeighbour(c, vip) == macs[who[0]] && ask() {
				old = who[0]
				return true
			}
			return false
		}); err != nil {
			return fmt.Errorf("round %d: no single announcer of %s: %w", r+1, vip, err)
		}
		if err := labCmd("stop", "agent/"+old); err != nil {
			return err
		}
		stopped := time.Now()
		lease, err := cs.CoordinationV1().Leases(lab.HeartbeatNamespace).Get(ctx, "lace-agent-"+old, metav1.GetOptions{})
		if err != nil || lease.Spec.RenewTime == nil {
			return fmt.Errorf("lease of %s: %v", old, err)
		}
		var took time.Time
		err = until(ctx, 20*time.Second, func() bool {
			mac := lab.ExternalNeighbour(c, vip)
			if mac != "" && mac != macs[old] && ask() {
				took = time.Now()
				return true
			}
			return false
		})
		if startErr := labCmd("start", "agent/"+old); startErr != nil {
			return startErr
		}
		if err != nil {
			return fmt.Errorf("round %d: nobody took %s over from %s: %w", r+1, vip, old, err)
		}
		fromBeat = append(fromBeat, took.Sub(lease.Spec.RenewTime.Time))
		fromStop = append(fromStop, took.Sub(stopped))
	}
	slices.Sort(fromBeat)
	slices.Sort(fromStop)
	fmt.Printf("L2 failover of a LoadBalancer VIP (%s), announcer's agent stopped, %d rounds, from the external host\n", vip, rounds)
	fmt.Printf("  %-58s %8s %8s\n", "", "median", "max")
	fmt.Printf("  %-58s %7.2fs %7.2fs\n", "last heartbeat of the dead agent -> answered via new node", fromBeat[len(fromBeat)/2].Seconds(), fromBeat[len(fromBeat)-1].Seconds())
	fmt.Printf("  %-58s %7.2fs %7.2fs\n", "agent gone (lace-lab stop returned) -> answered", fromStop[len(fromStop)/2].Seconds(), fromStop[len(fromStop)-1].Seconds())
	fmt.Printf("  target <= 3 s. Lace: lease %s, takeover when it lapses, gratuitous ARP / unsolicited NA.\n", "2s")
	fmt.Printf("  MetalLB L2 (documented, metallb.universe.tf/concepts/layer2, not measured here): failed node detected by\n" +
		"  memberlist, then gratuitous packets; \"failover happens within a few seconds\" for clients that honour them;\n" +
		"  MetalLB <= 0.7 documented a leader lease timing out after 10 s.\n\n")
	return nil
}

func until(ctx context.Context, timeout time.Duration, ok func() bool) error {
	deadline := time.Now().Add(timeout)
	for !ok() {
		if time.Now().After(deadline) {
			return errors.New("timed out")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}
