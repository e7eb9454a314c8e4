package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/lace-cni/lace/internal/lab"
	"github.com/lace-cni/lace/internal/netutil"
)

// result of one path: throughput and request/response latency.
type result struct {
	gbps          float64
	p50, p99      time.Duration
	transactionsS float64
}

func labClient(name string) (kubernetes.Interface, lab.Config, error) {
	c := lab.DefaultConfig()
	c.Name = name
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig())
	if err != nil {
		return nil, c, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	return cs, c, err
}

// benchForwarding measures pod-to-pod paths of the lab and the plain veth
// peers in the same run.
func benchForwarding(ctx context.Context, name string, dur time.Duration) error {
	cs, c, err := labClient(name)
	if err != nil {
		return err
	}
	nsOf := map[string]string{}
	ipOf := map[string]netip.Addr{}
	for _, p := range []struct{ name, node string }{{"bench-a", "n1"}, {"bench-b", "n1"}, {"bench-c", "n2"}} {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.name}, Spec: corev1.PodSpec{NodeName: p.node,
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers:                    []corev1.Container{{Name: "pause", Image: "registry.k8s.io/pause:3.10"}}}}
		if _, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	deadline := time.Now().Add(time.Minute)
	for len(nsOf) < 3 && time.Now().Before(deadline) {
		for _, n := range []string{"bench-a", "bench-b", "bench-c"} {
			p, err := cs.CoreV1().Pods("default").Get(ctx, n, metav1.GetOptions{})
			if err == nil && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
				ns, err := lab.PodNetNS(ctx, c, "default", n)
				if err != nil {
					return err
				}
				nsOf[n] = ns
				ipOf[n] = netip.MustParseAddr(p.Status.PodIP)
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	if len(nsOf) < 3 {
		return errors.New("bench pods did not start")
	}

	peer, cleanup, err := plainPeers(name)
	if err != nil {
		return err
	}
	defer cleanup()

	type row struct {
		name       string
		lace, peer result
		peerName   string
	}
	var rows []row
	// The paths take turns, rounds times, so that drift on a busy machine
	// hits each of them alike; each reports its median round.
	paths := []struct {
		name     string
		src, dst string
		addr     netip.Addr
	}{
		{"same node", nsOf["bench-a"], nsOf["bench-b"], ipOf["bench-b"]},
		{"across nodes", nsOf["bench-a"], nsOf["bench-c"], ipOf["bench-c"]},
		{"veth pair", peer.a, peer.b, peer.bAddr},
		{"routed veth", peer.a, peer.c, peer.cAddr},
	}
	samples := make([][]result, len(paths))
	for range rounds {
		for i, p := range paths {
			r, err := measurePath(ctx, p.src, p.dst, p.addr, dur)
			if err != nil {
				return fmt.Errorf("%s: %w", p.name, err)
			}
			samples[i] = append(samples[i], r)
		}
	}
	same, cross, direct, routed := median(samples[0]), median(samples[1]), median(samples[2]), median(samples[3])
	// The peer is the same for every row: two namespaces joined by a plain
	// veth pair, kernel routing. The routed row shows what one kernel
	// routing hop costs on this machine, for scale.
	rows = append(rows,
		row{"Lace pod to pod, same node", same, direct, "veth pair"},
		row{"Lace pod to pod, across nodes (SRv6)", cross, direct, "veth pair"},
		row{"reference: veth + kernel router hop", routed, direct, "veth pair"})

	fmt.Printf("Forwarding (IPv4, one TCP stream; request/response = 1-byte ping-pong on one connection; median of %d interleaved rounds of %s)\n", rounds, dur)
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "path\tpeer\tLace Gbit/s\tpeer Gbit/s\tratio\tLace p50\tpeer p50\tratio\tLace p99\tpeer p99\tratio\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%.2f\t%.2f\t%.2f\t%s\t%s\t%.2f\t%s\t%s\t%.2f\t\n", r.name, r.peerName,
			r.lace.gbps, r.peer.gbps, r.lace.gbps/r.peer.gbps,
			us(r.lace.p50), us(r.peer.p50), float64(r.lace.p50)/float64(r.peer.p50),
			us(r.lace.p99), us(r.peer.p99), float64(r.lace.p99)/float64(r.peer.p99))
	}
	tw.Flush()
	fmt.Println("throughput ratio = Lace / peer (higher is better); latency ratio = Lace / peer (lower is better)")
	fmt.Println()
	for _, n := range []string{"bench-a", "bench-b", "bench-c"} {
		_ = cs.CoreV1().Pods("default").Delete(ctx, n, metav1.DeleteOptions{})
	}
	return nil
}

// rounds is how many times each path is measured.
const rounds = 3

// median takes each figure's median over the rounds.
func median(rs []result) result {
	pick := func(f func(result) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		sort.Float64s(v)
		return v[len(v)/2]
	}
	return result{
		gbps:          pick(func(r result) float64 { return r.gbps }),
		p50:           time.Duration(pick(func(r result) float64 { return float64(r.p50) })),
		p99:           time.Duration(pick(func(r result) float64 { return float64(r.p99) })),
		transactionsS: pick(func(r result) float64 { return r.transactionsS }),
	}
}

func us(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e3, 'f', 1, 64) + "µs" }

// peers is the baseline: namespaces a and b joined by one veth pair, and c
// reached from a through a routing namespace r.
type peers struct {
	a, b, c      string
	bAddr, cAddr netip.Addr
}

func plainPeers(name string) (peers, func(), error) {
	ns := func(s string) string { return name + "-peer" + s }
	cleanup := func() {
		for _, s := range []string{"a", "b", "c", "r"} {
			_ = netutil.DeleteNamed(ns(s))
		}
	}
	p := peers{a: netutil.Path(ns("a")), b: netutil.Path(ns("b")), c: netutil.Path(ns("c")),
		bAddr: netip.MustParseAddr("10.255.1.2"), cAddr: netip.MustParseAddr("10.255.3.2")}
	steps := []func() error{
		func() error { return netutil.CreateNamed(ns("a")) },
		func() error { return netutil.CreateNamed(ns("b")) },
		func() error { return netutil.CreateNamed(ns("c")) },
		func() error { return netutil.CreateNamed(ns("r")) },
		func() error {
			return netutil.EnsureVeth(netutil.VethSpec{NSPath: p.a, Name: "tob", PeerNSPath: p.b, PeerName: "toa"})
		},
		func() error { return netutil.EnsureAddr(p.a, "tob", netip.MustParsePrefix("10.255.1.1/24")) },
		func() error { return netutil.EnsureAddr(p.b, "toa", netip.MustParsePrefix("10.255.1.2/24")) },
		func() error {
			return netutil.EnsureVeth(netutil.VethSpec{NSPath: p.a, Name: "tor", PeerNSPath: netutil.Path(ns("r")), PeerName: "toa"})
		},
		func() error {
			return netutil.EnsureVeth(netutil.VethSpec{NSPath: netutil.Path(ns("r")), Name: "toc", PeerNSPath: p.c, PeerName: "tor"})
		},
		func() error { return netutil.EnsureAddr(p.a, "tor", netip.MustParsePrefix("10.255.2.1/24")) },
		func() error {
			return netutil.EnsureAddr(netutil.Path(ns("r")), "toa", netip.MustParsePrefix("10.255.2.2/24"))
		},
		func() error {
			return netutil.EnsureAddr(netutil.Path(ns("r")), "toc", netip.MustParsePrefix("10.255.3.1/24"))
		},
		func() error { return netutil.EnsureAddr(p.c, "tor", netip.MustParsePrefix("10.255.3.2/24")) },
		func() error { return netutil.Sysctl(netutil.Path(ns("r")), "net.ipv4.ip_forward", "1") },
		func() error {
			return netutil.EnsureRoute(p.a, netip.MustParsePrefix("10.255.3.0/24"), netip.MustParseAddr("10.255.2.2"), "tor")
		},
		func() error {
			return netutil.EnsureRoute(p.c, netip.MustParsePrefix("10.255.2.0/24"), netip.MustParseAddr("10.255.3.1"), "tor")
		},
	}
	for _, s := range steps {
		if err := s(); err != nil {
			cleanup()
			return p, nil, err
		}
	}
	return p, cleanup, nil
}

// measurePath runs a throughput test then a request/response test from
// namespace src to addr (served in namespace dst).
func measurePath(ctx context.Context, src, dst string, addr netip.Addr, dur time.Duration) (result, error) {
	var r result
	var ln net.Listener
	if err := netutil.Do(dst, func() error {
		var err error
		ln, err = net.Listen("tcp", net.JoinHostPort(addr.String(), "5201"))
		return err
	}); err != nil {
		return r, err
	}
	defer ln.Close()
	mode := make(chan string, 1)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if <-mode == "stream" {
					_, _ = io.Copy(io.Discard, c)
					return
				}
				b := make([]byte, 1)
				for {
					if _, err := io.ReadFull(c, b); err != nil {
						return
					}
					if _, err := c.Write(b); err != nil {
						return
					}
				}
			}()
		}
	}()
	dial := func() (net.Conn, error) {
		return netutil.DialContext(ctx, src, "tcp", net.JoinHostPort(addr.String(), "5201"))
	}

	mode <- "stream"
	conn, err := dial()
	if err != nil {
		return r, err
	}
	buf := make([]byte, 256<<10)
	var sent int64
	start := time.Now()
	for time.Since(start) < dur {
		n, err := conn.Write(buf)
		sent += int64(n)
		if err != nil {
			conn.Close()
			return r, err
		}
	}
	elapsed := time.Since(start)
	conn.Close()
	r.gbps = float64(sent*8) / elapsed.Seconds() / 1e9

	mode <- "rr"
	conn, err = dial()
	if err != nil {
		return r, err
	}
	defer conn.Close()
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	var lat []time.Duration
	one := []byte{1}
	start = time.Now()
	for time.Since(start) < dur {
		t := time.Now()
		if _, err := conn.Write(one); err != nil {
			return r, err
		}
		if _, err := io.ReadFull(conn, one); err != nil {
			return r, err
		}
		lat = append(lat, time.Since(t))
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	r.p50, r.p99 = lat[len(lat)/2], lat[len(lat)*99/100]
	r.transactionsS = float64(len(lat)) / time.Since(start).Seconds()
	return r, nil
}
