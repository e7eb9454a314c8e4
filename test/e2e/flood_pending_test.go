package e2e

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/lace-cni/lace/internal/netutil"
)

// delayedUDPServer listens at addr in the namespace at nsPath and answers
// every datagram with the same bytes after delay; it stops with the test.
func delayedUDPServer(t *testing.T, nsPath string, addr netip.AddrPort, delay time.Duration) netip.AddrPort {
	t.Helper()
	var pc net.PacketConn
	if err := netutil.Do(nsPath, func() error {
		c, err := net.ListenPacket("udp", addr.String())
		pc = c
		return err
	}); err != nil {
		t.Fatalf("delayed UDP server: %v", err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 256)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			msg := append([]byte(nil), buf[:n]...)
			time.AfterFunc(delay, func() { _, _ = pc.WriteTo(msg, from) })
		}
	}()
	return addr
}

type pendingResult struct {
	opened, answered int
	err              error
}

// pendingUDP opens n UDP flows from the namespace at nsPath to dst (one
// socket each, one datagram) and waits up to wait for each answer.
func pendingUDP(nsPath string, dst netip.AddrPort, n int, wait time.Duration) pendingResult {
	var conns []net.PacketConn
	res := pendingResult{}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := range n {
		var pc net.PacketConn
		if err := netutil.Do(nsPath, func() error {
			c, err := net.ListenPacket("udp", ":0")
			pc = c
			return err
		}); err != nil {
			res.err = err
			return res
		}
		conns = append(conns, pc)
		if _, err := pc.WriteTo(fmt.Appendf(nil, "pending %d", i), net.UDPAddrFromAddrPort(dst)); err != nil {
			res.err = err
			return res
		}
		res.opened++
	}
	deadline := time.Now().Add(wait)
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for i, pc := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = pc.SetReadDeadline(deadline)
			buf := make([]byte, 256)
			n, _, err := pc.ReadFrom(buf)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				errs = append(errs, fmt.Errorf("flow %d: %w", i, err))
			case string(buf[:n]) != fmt.Sprintf("pending %d", i):
				errs = append(errs, fmt.Errorf("flow %d: answered %q", i, buf[:n]))
			default:
				res.answered++
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		res.err = errors.Join(errs[0], fmt.Errorf("%d flows without their answer", len(errs)))
	}
	return res
}
