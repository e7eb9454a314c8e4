package chaos

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/lace-cni/lace/internal/lacectl"
	"github.com/lace-cni/lace/internal/model"
	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/lab"
)

// checkMatrix asks a fresh UDP question from every workload pod to every
// other, over IPv4 and over IPv6, and compares each outcome with the
// oracle: model.Reach on the cluster's networks and policies as they are
// now (what lacectl answers). A question the oracle refuses must go
// unanswered and move its drop counter: each reason's counters, summed
// over the nodes, must move by at least as many questions as it refused.
func (w *workload) checkMatrix(ctx context.Context) error {
	var names []string
	for name := range w.pods {
		names = append(names, name)
	}
	slices.Sort(names)
	// Right after an outage the API server answers slowly for a while:
	// what the questions need is read again until it comes.
	var topo model.Topology
	netns := map[string]string{}
	err := until(ctx, time.Minute, "the topology and the pods' namespaces", func() (err error) {
		if topo, err = lacectl.ReadTopology(ctx, w.h.c); err != nil {
			return err
		}
		for _, name := range names {
			if netns[name], err = lab.PodNetNS(ctx, w.h.cfg, Namespace, name); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	type question struct {
		from, to string
		dst      netip.AddrPort
		want     model.Verdict
		answered bool
	}
	var qs []*question
	for _, from := range names {
		for _, to := range names {
			if from == to {
				continue
			}
			for _, v6 := range []bool{false, true} {
				src, dst := w.pods[from], w.pods[to]
				sa, da := podAddr(src, v6), podAddr(dst, v6)
				if !sa.IsValid() || !da.IsValid() {
					return fmt.Errorf("%s or %s has no address of its family (IPv6 %v)", from, to, v6)
				}
				qs = append(qs, &question{from: from, to: to, dst: netip.AddrPortFrom(da, udpPort),
					want: model.Reach(topo, podEndpoint(src, sa), podEndpoint(dst, da), "UDP", udpPort)})
			}
		}
	}
	refused := map[model.DropReason]uint64{}
	for _, q := range qs {
		if !q.want.Allowed && q.want.Reason != "" {
			refused[q.want.Reason]++
		}
	}
	before, err := w.dropsByReason(refused)
	if err != nil {
		return err
	}
	// All at once: a refused question waits out its timeouts.
	var wg sync.WaitGroup
	for _, q := range qs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			q.answered = askUDP(ctx, netns[q.from], q.dst)
		}()
	}
	wg.Wait()
	var problems []string
	for _, q := range qs {
		if q.answered != q.want.Allowed {
			problems = append(problems, fmt.Sprintf("%s -> %s (%s): answered %v, the oracle says %v (%s)",
				q.from, q.to, q.dst.Addr(), q.answered, q.want.Allowed, q.want.Rule))
		}
	}
	after, err := w.dropsByReason(refused)
	if err != nil {
		return err
	}
	for reason, n := range refused {
		if moved := after[reason] - before[reason]; moved < n {
			problems = append(problems, fmt.Sprintf("%d questions refused as %s, but its counters moved by %d", n, reason, moved))
		}
	}
	if len(problems) > 0 {
		slices.Sort(problems)
		return fmt.Errorf("reachability differs from the oracle in %d of %d questions: %s", len(problems), len(qs), strings.Join(problems, "; "))
	}
	n := 0
	for _, c := range refused {
		n += int(c)
	}
	w.h.printf("  reachability: %d questions between %d pods, %d refused, each as the oracle says", len(qs), len(names), n)
	return nil
}

// podEndpoint is a workload pod at address a, as the oracle knows it.
func podEndpoint(p *corev1.Pod, a netip.Addr) model.Endpoint {
	network := p.Labels[labelNet]
	if network == "" {
		network = defaultNetwork
	}
	return model.Endpoint{Kind: model.EndpointPod, Network: network, Addr: a, NodeName: p.Spec.NodeName}
}

// defaultNetwork is the network of pods no binding policy selects.
const defaultNetwork = "default"

// dropsByReason sums, over the nodes, the drop counters of each reason.
func (w *workload) dropsByReason(reasons map[model.DropReason]uint64) (map[model.DropReason]uint64, error) {
	out := map[model.DropReason]uint64{}
	var errs []error
	for reason := range reasons {
		for _, node := range w.nodes {
			n, err := drops(w.h.cfg, node, string(reason))
			errs = append(errs, err)
			out[reason] += n
		}
	}
	return out, errors.Join(errs...)
}

// askUDP asks netexec one question (retried twice: a question lost to
// the machine's load is not a refusal) and says whether it was answered.
func askUDP(ctx context.Context, ns string, dst netip.AddrPort) bool {
	conn, err := netutil.DialContext(ctx, ns, "udp", dst.String())
	if err != nil {
		return false
	}
	defer conn.Close()
	buf := make([]byte, 64)
	for try := 0; try < 3; try++ {
		_ = conn.SetDeadline(time.Now().Add(probeTimeout))
		if _, err := fmt.Fprintf(conn, "echo m%d", try); err != nil {
			return false
		}
		if n, err := conn.Read(buf); err == nil && strings.HasPrefix(string(buf[:n]), "m") {
			return true
		}
	}
	return false
}
