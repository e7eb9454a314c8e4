package e2e

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/lab"
)

// nodeDatapath opens node's pinned data plane maps (closed at cleanup).
func nodeDatapath(t *testing.T, node string) *datapath.Datapath {
	t.Helper()
	dp, err := datapath.Load(filepath.Join(labConfig().NodeRoot(node), "sys/fs/bpf/lace"))
	if err != nil {
		t.Fatalf("open the data plane of %s: %v", node, err)
	}
	t.Cleanup(func() { dp.Close() })
	return dp
}

// shortTCPServer accepts on addr in the namespace at nsPath and serves
// one short exchange per connection: a byte in, a byte out, then it waits
// for the client to close first (so the server keeps no TIME_WAIT).
func shortTCPServer(t *testing.T, nsPath string, addr netip.AddrPort) {
	t.Helper()
	ln, err := netutil.Listen(nsPath, "tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				b := make([]byte, 1)
				if _, err := io.ReadFull(c, b); err != nil {
					return
				}
				if _, err := c.Write(b); err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, c)
			}()
		}
	}()
}

// udpEchoServer answers every datagram to addr in the namespace at nsPath
// with the same bytes, whatever their size.
func udpEchoServer(t *testing.T, nsPath string, addr netip.AddrPort) {
	t.Helper()
	var pc net.PacketConn
	err := netutil.Do(nsPath, func() error {
		c, err := net.ListenPacket("udp", addr.String())
		pc = c
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 65536)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(buf[:n], from)
		}
	}()
}

// shortTCP opens one connection to dst (the caller's thread is in the
// client's namespace), exchanges a byte and closes first.
func shortTCP(dst netip.AddrPort) error {
	c, err := net.DialTimeout("tcp", dst.String(), 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte{'x'}); err != nil {
		return err
	}
	b := make([]byte, 1)
	_, err = io.ReadFull(c, b)
	return err
}

// shortUDP sends one request to dst from a new socket (a new source port,
// so a new flow) and waits for the answer, asking again on the same
// socket (the same flow) up to three times.
func shortUDP(dst netip.AddrPort) error {
	c, err := net.Dial("udp", dst.String())
	if err != nil {
		return err
	}
	defer c.Close()
	b := make([]byte, 16)
	for range 3 {
		if _, err = c.Write([]byte("ping")); err != nil {
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		if _, err = c.Read(b); err == nil {
			return nil
		}
	}
	return err
}

// churn runs n exchanges with workers goroutines, each with its thread in
// the namespace at nsPath, and returns how many failed (it stops after 64)
// and the first error.
func churn(t *testing.T, nsPath string, n, workers int, one func(i int) error) (failed int64, first error) {
	t.Helper()
	var next, bad atomic.Int64
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := netutil.Do(nsPath, func() error {
				for {
					i := int(next.Add(1)) - 1
					// Enough failures tell; the rest would only wait out
					// their timeouts.
					if i >= n || bad.Load() >= 64 {
						return nil
					}
					if err := one(i); err != nil {
						bad.Add(1)
						mu.Lock()
						if first == nil {
							first = fmt.Errorf("exchange %d: %w", i, err)
						}
						mu.Unlock()
					}
				}
			})
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	return bad.Load(), first
}

// TestSNATPortsFreed: a node has 4536 SNAT ports per outside destination;
// each is free again as soon as the flow that held it is over. A pod on
// n2 opens 20,000 short TCP connections to one port of the lab's external
// host (each closed before the next takes its port) and 20,000 UDP
// exchanges, each from a new source port (held 30 s after its answer, so
// spread over 16 server ports: 1,250 per destination), then 100 more that
// all succeed; n2 never counts snat-failed, nor snat-closed (a closing
// flow's last ACK keeps its port).
func TestSNATPortsFreed(t *testing.T) {
	needLab(t)
	pod := netPod(t, "snat-churn", "default", "n2", true)
	ns := podNetNS(t, pod)
	ext := externalNS()
	extV4, _ := lab.ExternalUnderlay()
	tcpDst := netip.AddrPortFrom(extV4, 9191)
	shortTCPServer(t, ext, tcpDst)
	var udpDst []netip.AddrPort
	for i := range 16 {
		a := netip.AddrPortFrom(extV4, uint16(9200+i))
		udpEchoServer(t, ext, a)
		udpDst = append(udpDst, a)
	}
	eventually(t, 30*time.Second, "the pod reaches the external host", func() error {
		return netutil.Do(ns, func() error { return shortTCP(tcpDst) })
	})
	before := nodeDrops(t, "n2")

	const n = 20000
	start := time.Now()
	failed, first := churn(t, ns, n, 32, func(int) error { return shortTCP(tcpDst) })
	t.Logf("%d short TCP connections to %s in %v: %d failed (first: %v)", n, tcpDst, time.Since(start).Round(time.Millisecond), failed, first)
	if failed > 0 {
		t.Errorf("%d of %d short TCP connections failed; first: %v", failed, n, first)
	}
	start = time.Now()
	failed, first = churn(t, ns, n, 32, func(i int) error { return shortUDP(udpDst[i%len(udpDst)]) })
	t.Logf("%d UDP exchanges with %d ports of %s in %v: %d failed (first: %v)", n, len(udpDst), extV4, time.Since(start).Round(time.Millisecond), failed, first)
	if failed > 0 {
		t.Errorf("%d of %d UDP exchanges failed; first: %v", failed, n, first)
	}

	// And then more: the ports the finished flows held are free.
	failed, first = churn(t, ns, 100, 4, func(i int) error {
		if i%2 == 0 {
			return shortTCP(tcpDst)
		}
		return shortUDP(udpDst[i%len(udpDst)])
	})
	if failed > 0 {
		t.Errorf("%d of the 100 flows after the churn failed; first: %v", failed, first)
	}
	after := nodeDrops(t, "n2")
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			t.Logf("n2 dropped %d as %s during the churn", d, k)
		}
	}
	if d := after["snat-failed"] - before["snat-failed"]; d != 0 {
		t.Errorf("n2 counted %d snat-failed during the churn, want 0", d)
	}
	// A port handed on before its flow's last ACK passed drops that ACK
	// as snat-closed (and the external host, left in LAST_ACK, stalls
	// the next flow on the port).
	if d := after["snat-closed"] - before["snat-closed"]; d != 0 {
		t.Errorf("n2 counted %d snat-closed during the churn, want 0: a closing flow lost its port", d)
	}
	ex, err := nodeDatapath(t, "n2").SNATExhaustedCounts()
	if err != nil {
		t.Fatal(err)
	}
	for _, dst := range append([]netip.AddrPort{tcpDst}, udpDst...) {
		for _, proto := range []string{"tcp/", "udp/"} {
			if c := ex[proto+dst.String()]; c != 0 {
				t.Errorf("n2 names %s%s as exhausted %d times", proto, dst, c)
			}
		}
	}
}

// TestSNATClosedAfterFlow: a pod on n2 exchanges UDP with the external
// host from a fixed port, and keeps that socket open. While the flow's
// conntrack entry lives, the external host's datagrams to the node port
// it saw reach the pod; once the entry expired, the same datagrams (from
// the same address and port) reach nobody and n2 counts them snat-closed.
func TestSNATClosedAfterFlow(t *testing.T) {
	needLab(t)
	pod := netPod(t, "snat-closed", "default", "n2", true)
	ns := podNetNS(t, pod)
	ext := externalNS()
	extV4, _ := lab.ExternalUnderlay()
	server := netip.AddrPortFrom(extV4, 9300)

	// The external host's socket: it learns the node port it is asked
	// from, and later sends from the same address and port.
	var epc net.PacketConn
	if err := netutil.Do(ext, func() error {
		c, err := net.ListenPacket("udp", server.String())
		epc = c
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer epc.Close()
	var pc net.PacketConn
	if err := netutil.Do(ns, func() error {
		c, err := net.ListenPacket("udp", ":45000")
		pc = c
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer pc.Close()

	var mapped netip.AddrPort
	eventually(t, 30*time.Second, "the pod's datagram reaches the external host", func() error {
		if _, err := pc.WriteTo([]byte("hello"), net.UDPAddrFromAddrPort(server)); err != nil {
			return err
		}
		_ = epc.SetReadDeadline(time.Now().Add(time.Second))
		b := make([]byte, 64)
		_, from, err := epc.ReadFrom(b)
		if err != nil {
			return err
		}
		mapped = from.(*net.UDPAddr).AddrPort()
		mapped = netip.AddrPortFrom(mapped.Addr().Unmap(), mapped.Port())
		return nil
	})
	if n2v4, _ := lab.NodeUnderlay(2); mapped.Addr() != n2v4 || mapped.Port() < 61000 {
		t.Fatalf("the external host saw %s, want n2's address and a SNAT port", mapped)
	}
	// received reports whether a datagram from the external host reaches
	// the pod's socket within wait.
	received := func(wait time.Duration) bool {
		if _, err := epc.WriteTo([]byte("unsolicited"), net.UDPAddrFromAddrPort(mapped)); err != nil {
			t.Fatal(err)
		}
		_ = pc.SetReadDeadline(time.Now().Add(wait))
		b := make([]byte, 64)
		_, _, err := pc.ReadFrom(b)
		return err == nil
	}
	if !received(2 * time.Second) {
		t.Fatalf("the external host's answer to %s did not reach the pod while the flow lives", mapped)
	}

	// The flow's entry expires (30 s after its last packet, nothing
	// refreshes it now).
	podV4, _ := podAddrs(pod)
	dp := nodeDatapath(t, "n2")
	eventually(t, 150*time.Second, "the flow's conntrack entry expires", func() error {
		flows, err := dp.Conntrack()
		if err != nil {
			return err
		}
		now, err := monotonicNanos()
		if err != nil {
			return err
		}
		for _, f := range flows {
			if f.Local == netip.AddrPortFrom(podV4, 45000) && f.Remote == server && f.ExpiresMonotonicNanos > now {
				return fmt.Errorf("the flow lives %v more", time.Duration(f.ExpiresMonotonicNanos-now).Round(time.Second))
			}
		}
		return nil
	})
	before := nodeDrops(t, "n2")
	for range 3 {
		if received(time.Second) {
			t.Errorf("a datagram to %s reached the pod after its flow was over", mapped)
		}
	}
	if d := nodeDrops(t, "n2")["snat-closed"] - before["snat-closed"]; d < 3 {
		t.Errorf("n2 counted %d datagrams snat-closed, want 3", d)
	}
}

// monotonicNanos is the clock of the data plane's deadlines.
func monotonicNanos() (uint64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, err
	}
	return uint64(ts.Nano()), nil
}
