package chaos

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/lab"
)

// SNAT ports are leaked when a flow that no pod can end any more holds
// one: lace_snat never evicts, and the agent's sweep frees only the
// mappings of flows that are over, so a live conntrack entry of a pod
// that is gone would keep its node port until the entry expires (hours
// for an established TCP flow). The pod batches make such flows on
// purpose: some of their pods hold a connection to the external host when
// they are deleted, and never close it.

// heldPerNode is how many pods of a batch, per node, hold a connection to
// the outside when they are deleted.
const heldPerNode = 2

// holdOutside opens, from up to heldPerNode of pods on each node, a TCP
// connection to the external host's echo server (IPv4 and IPv6 in turn),
// and asks one question on it: an established, answered flow through the
// node's SNAT, which it awaits in the node's conntrack. The caller closes the connections once the pods are gone,
// so they end with no packet the node sees.
func (w *workload) holdOutside(ctx context.Context, pods []corev1.Pod) ([]net.Conn, error) {
	extV4, extV6 := lab.ExternalUnderlay()
	per := map[string]int{}
	held := map[string][]netip.Addr{}
	var conns []net.Conn
	for _, p := range pods {
		if per[p.Spec.NodeName] >= heldPerNode {
			continue
		}
		nsPath, err := lab.PodNetNS(ctx, w.h.cfg, Namespace, p.Name)
		if err != nil {
			return conns, err
		}
		ext := extV4
		if len(conns)%2 == 1 {
			ext = extV6
		}
		dst := netip.AddrPortFrom(ext, outsideHTTPPort).String()
		dctx, cancel := context.WithTimeout(ctx, streamTimeout)
		conn, err := netutil.DialContext(dctx, nsPath, "tcp", dst)
		cancel()
		if err != nil {
			return conns, fmt.Errorf("pod %s to the outside %s: %w", p.Name, dst, err)
		}
		conns = append(conns, conn)
		if err := askHTTP(conn, bufio.NewReader(conn), p.Name); err != nil {
			return conns, fmt.Errorf("pod %s to the outside %s: %w", p.Name, dst, err)
		}
		per[p.Spec.NodeName]++
		src, _ := netip.ParseAddrPort(conn.LocalAddr().String())
		held[p.Spec.NodeName] = append(held[p.Spec.NodeName], src.Addr().Unmap())
	}
	// The check must see them, or it proves nothing when they are gone.
	err := until(ctx, 30*time.Second, "the held connections' flows seen", func() error {
		for node, want := range held {
			got, err := snatHolders(w.h.cfg.PinDir(node))
			if err != nil {
				return fmt.Errorf("node %s: %w", node, err)
			}
			for _, a := range want {
				if got[a] == 0 {
					return fmt.Errorf("node %s holds no translated flow of %s", node, a)
				}
			}
		}
		return nil
	})
	if err != nil {
		return conns, err
	}
	w.h.printf("  %d pods hold a connection to the outside as they are deleted", len(conns))
	return conns, nil
}

func closeAll(conns []net.Conn) {
	for _, c := range conns {
		_ = c.Close()
	}
}

// checkSNAT fails when a node holds a live translated flow (one that
// holds a SNAT port) of a pod network's address none of its pods has,
// within settleWindow.
func checkSNAT(ctx context.Context, h *harness) error {
	return until(ctx, settleWindow, "no SNAT port held for a pod that is gone", func() error {
		pods, err := h.cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		d := &desired{podAddrs: map[string]map[netip.Addr]bool{}}
		if err := d.addPods(pods.Items); err != nil {
			return err
		}
		// Flows of external frontends (a NodePort, a VIP) are keyed by
		// the frontend's address: only the pod networks' count.
		var nets lacev1.NetworkList
		if err := h.c.List(ctx, &nets); err != nil {
			return err
		}
		var subnets []netip.Prefix
		for _, n := range nets.Items {
			for _, sn := range []*lacev1.Subnet{n.Spec.IPv4Subnet, n.Spec.IPv6Subnet} {
				if sn == nil {
					continue
				}
				p, err := netip.ParsePrefix(string(sn.Prefix))
				if err != nil {
					return fmt.Errorf("network %s subnet %q: %w", n.Name, sn.Prefix, err)
				}
				subnets = append(subnets, p)
			}
		}
		ofPods := func(a netip.Addr) bool {
			return slices.ContainsFunc(subnets, func(p netip.Prefix) bool { return p.Contains(a) })
		}
		var errs []error
		for i := 1; i <= h.cfg.Nodes; i++ {
			node := h.cfg.NodeName(i)
			held, err := snatHolders(h.cfg.PinDir(node))
			if err != nil {
				return fmt.Errorf("node %s: %w", node, err)
			}
			var leaked []string
			for a, n := range held {
				if ofPods(a) && !d.podAddrs[node][a] {
					leaked = append(leaked, fmt.Sprintf("%s (%d)", a, n))
				}
			}
			if len(leaked) > 0 {
				errs = append(errs, fmt.Errorf("node %s holds SNAT ports for flows of addresses no pod has: %v", node, leaked))
			}
		}
		return errors.Join(errs...)
	})
}

// The conntrack layouts (bpf/include/ct.h).
const (
	ctKeySize  = 44 // struct ct_key: u32 net_id, u8 family, u8 proto, u16 pad, be16 lport, be16 rport, u8 laddr[16], u8 raddr[16]
	ctValSize  = 40 // struct ct_val: u64 expires, u32 peer_net, u16 flags, be16 snat_port, u8 nat_addr[16], be16 nat_port, u16 pad
	ctFlagSNAT = 32 // CT_SNAT
)

// snatHolders counts, by local address, the live flows in a node's
// conntrack maps that hold a SNAT port. Expiry is bpf_ktime_get_ns's
// clock, CLOCK_MONOTONIC, which every namespace shares.
func snatHolders(dir string) (map[netip.Addr]int, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return nil, err
	}
	now := uint64(ts.Nano())
	out := map[netip.Addr]int{}
	for _, m := range []string{"lace_ct", "lace_ct_new", "lace_ct_local"} {
		err := walkMap(dir, m, ctKeySize, ctValSize, func(k, v []byte) {
			expires, flags := binary.LittleEndian.Uint64(v), binary.LittleEndian.Uint16(v[12:14])
			if flags&ctFlagSNAT != 0 && expires >= now {
				out[addrFrom(k[4], k[12:28])]++
			}
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}
