package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"sort"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lace-cni/lace/internal/netutil"
)

// The first packet through a VIP: new TCP connections timed on each path,
// and the ratio of their medians with a confidence interval, precise
// enough to tell whether two paths differ at all.

// connPath is a path new TCP connections are timed on.
type connPath struct {
	name string
	ns   string
	dst  netip.AddrPort
}

type rttResult struct {
	n   int
	lat [][]time.Duration // per path, sorted
}

// acceptAndClose serves addr in the namespace at nsPath: every connection
// is accepted and closed.
func acceptAndClose(nsPath, addr string) (func(), error) {
	return serveTCP(nsPath, addr, func(c net.Conn) { c.Close() })
}

// serveTCP listens on addr in the namespace at nsPath and hands every
// connection to handle, on the accepting goroutine; it returns what
// stops listening.
func serveTCP(nsPath, addr string, handle func(net.Conn)) (func(), error) {
	ln, err := netutil.Listen(nsPath, "tcp", addr)
	if err != nil {
		return nil, err
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			handle(c)
		}
	}()
	return func() { ln.Close() }, nil
}

// connectLatency times conns new TCP connections per path: a blocking
// connect() from a fresh socket, SYN to SYN-ACK, on one thread inside the
// path's namespace, pinned to one CPU (the last) so that no path's
// samples pay for a migration the others do not. The paths take turns in
// batches of 10, so that drift on a busy machine hits each alike.
func connectLatency(ctx context.Context, paths []connPath, conns int) ([][]time.Duration, error) {
	lat := make([][]time.Duration, len(paths))
	const batch = 10
	for done := 0; done < conns; done += batch {
		for i, p := range paths {
			n := min(batch, conns-done)
			err := netutil.Do(p.ns, func() error {
				restore, err := pinThread()
				if err != nil {
					return err
				}
				defer restore()
				sa := &unix.SockaddrInet4{Port: int(p.dst.Port()), Addr: p.dst.Addr().As4()}
				for range n {
					fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
					if err != nil {
						return err
					}
					t := time.Now()
					err = unix.Connect(fd, sa)
					d := time.Since(t)
					unix.Close(fd)
					if err != nil {
						return fmt.Errorf("%s: connect %s: %w", p.name, p.dst, err)
					}
					lat[i] = append(lat[i], d)
				}
				return nil
			})
			if err != nil {
				return nil, err
			}
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
		}
	}
	for _, l := range lat {
		sort.Slice(l, func(a, b int) bool { return l[a] < l[b] })
	}
	return lat, nil
}

// pinThread pins the calling thread (locked to it by netutil.Do) to the
// machine's last CPU and returns what puts its affinity back.
func pinThread() (func(), error) {
	var old, one unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		return nil, fmt.Errorf("CPU affinity: %w", err)
	}
	one.Set(runtime.NumCPU() - 1)
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		return nil, fmt.Errorf("pin to CPU %d: %w", runtime.NumCPU()-1, err)
	}
	return func() { _ = unix.SchedSetaffinity(0, &old) }, nil
}

// bootstrapRounds is how many resamples a confidence interval is drawn
// from.
const bootstrapRounds = 2000

// medianRatioCI is the 95% bootstrap confidence interval of the ratio of
// a's median to b's: each round resamples both with replacement.
func medianRatioCI(a, b []time.Duration) (lo, hi float64, ok bool) {
	if len(a) == 0 || len(b) == 0 {
		return 0, 0, false
	}
	rng := rand.New(rand.NewPCG(1, 2))
	ra, rb := make([]time.Duration, len(a)), make([]time.Duration, len(b))
	ratios := make([]float64, bootstrapRounds)
	median := func(s []time.Duration) time.Duration {
		slices.Sort(s)
		return s[len(s)/2]
	}
	for i := range ratios {
		for j := range ra {
			ra[j] = a[rng.IntN(len(a))]
		}
		for j := range rb {
			rb[j] = b[rng.IntN(len(b))]
		}
		if mb := median(rb); mb > 0 {
			ratios[i] = float64(median(ra)) / float64(mb)
		}
	}
	slices.Sort(ratios)
	return ratios[bootstrapRounds*25/1000], ratios[bootstrapRounds*975/1000-1], true
}

func ciString(lo, hi float64, ok bool) string {
	if !ok {
		return "-"
	}
	return fmt.Sprintf("%.3f-%.3f", lo, hi)
}

func printRTT(rs []rttResult, peer bool, conns int) {
	if len(rs) == 0 {
		return
	}
	fmt.Printf("First-packet RTT through a ClusterIP (new TCP connection: blocking connect(), SYN to SYN-ACK; %d per path and size, interleaved; client on %s, server pod on %s)\n",
		conns, peerNode, laceNode)
	if peer {
		fmt.Println("Lace's client is a pod (translated on its veth); kube-proxy's a socket of the node's namespace (nftables DNAT; Lace leaves it alone)")
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	if peer {
		fmt.Fprintln(tw, "services\tLace p50\tkube-proxy p50\tratio\t95% CI\tLace p99\tkube-proxy p99\tratio\tpod->pod p50\tnode->pod p50\tLace - direct\tkube-proxy - direct\t")
	} else {
		fmt.Fprintln(tw, "services\tLace p50\tLace p99\tpod->pod p50\tpod->pod p99\tLace / direct p50\t95% CI\t")
	}
	for _, r := range rs {
		q := func(i, p int) time.Duration { return quantile(r.lat[i], p) }
		if peer {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.n, us(q(0, 50)), us(q(2, 50)), ratio(q(0, 50), q(2, 50)),
				ciString(medianRatioCI(r.lat[0], r.lat[2])), us(q(0, 99)), us(q(2, 99)), ratio(q(0, 99), q(2, 99)), us(q(1, 50)), us(q(3, 50)),
				us(q(0, 50)-q(1, 50)), us(q(2, 50)-q(3, 50)))
		} else {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.n, us(q(0, 50)), us(q(0, 99)), us(q(1, 50)), us(q(1, 99)),
				ratio(q(0, 50), q(1, 50)), ciString(medianRatioCI(r.lat[0], r.lat[1])))
		}
	}
	tw.Flush()
	fmt.Println("ratio = Lace / kube-proxy (lower is better); targets: flat in the service count, ratio <= 0.7")
	fmt.Println("95% CI: of the ratio of the p50s, by bootstrap (2,000 resamples of each path's samples); a CI that holds 1 does not tell the two apart")
	if peer {
		fmt.Println("the two clients differ (pod vs node socket): 'X - direct' is each path's p50 minus the same client's p50 straight to the pod IP")
	}
	fmt.Println()
}
