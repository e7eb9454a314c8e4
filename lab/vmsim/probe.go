package vmsim

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lace-cni/lace/internal/netutil"
)

// PingInterval is how often the probe pings the guest (the interval the
// peers' published figures use).
const PingInterval = 10 * time.Millisecond

// Probe is what runs across a migration: a TCP stream from the guest to a
// peer (a pod elsewhere) and a ping from the peer to the guest every
// PingInterval. It records when each echo reply and each read of the
// stream arrives at the peer: a migration's outage is their longest gap.
type Probe struct {
	mu        sync.Mutex
	replies   []time.Time
	reads     []time.Time
	streamErr error
	stopping  bool

	fd     int
	ln     net.Listener
	guest  net.Conn
	peer   net.Conn
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// StartProbe starts the stream from g to peer:port and the ping from the
// peer's namespace (peerNS) to the guest's address to.
func StartProbe(g *Guest, peerNS string, peer, to netip.Addr, port int) (*Probe, error) {
	if !peer.Is4() || !to.Is4() {
		return nil, fmt.Errorf("the probe pings IPv4: %s -> %s", peer, to)
	}
	p := &Probe{fd: -1}
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	var err error
	if p.ln, err = netutil.Listen(peerNS, "tcp", netip.AddrPortFrom(peer, uint16(port)).String()); err != nil {
		p.Stop()
		return nil, err
	}
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := p.ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
	p.guest, err = netutil.DialContext(dctx, g.NS, "tcp", netip.AddrPortFrom(peer, uint16(port)).String())
	dcancel()
	if err != nil {
		p.Stop()
		return nil, fmt.Errorf("the guest's stream to %s: %w", peer, err)
	}
	in, ok := <-accepted
	if !ok {
		p.Stop()
		return nil, fmt.Errorf("the peer accepted no stream")
	}
	p.peer = in
	if p.fd, err = netutil.ICMPSocket(peerNS, false); err != nil {
		p.Stop()
		return nil, err
	}
	tv := unix.NsecToTimeval((100 * time.Millisecond).Nanoseconds())
	_ = unix.SetsockoptTimeval(p.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	var idb [2]byte
	_, _ = rand.Read(idb[:])
	id := binary.BigEndian.Uint16(idb[:])
	p.wg.Add(4)
	go p.write(ctx)
	go p.read(in)
	go p.ping(ctx, to, id)
	go p.pong(ctx, id)
	return p, nil
}

// write sends 512 bytes every millisecond.
func (p *Probe) write(ctx context.Context) {
	defer p.wg.Done()
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	buf := make([]byte, 512)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		_ = p.guest.SetWriteDeadline(time.Now().Add(10 * time.Second))
		if _, err := p.guest.Write(buf); err != nil {
			p.fail(fmt.Errorf("the guest's write: %w", err))
			return
		}
	}
}

func (p *Probe) read(in net.Conn) {
	defer p.wg.Done()
	defer in.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := in.Read(buf)
		if n > 0 {
			p.mu.Lock()
			p.reads = append(p.reads, time.Now())
			p.mu.Unlock()
		}
		if err != nil {
			if !p.isStopping() {
				p.fail(fmt.Errorf("the peer's read: %w", err))
			}
			return
		}
	}
}

func (p *Probe) ping(ctx context.Context, to netip.Addr, id uint16) {
	defer p.wg.Done()
	t := time.NewTicker(PingInterval)
	defer t.Stop()
	dst := &unix.SockaddrInet4{Addr: to.As4()}
	for seq := uint16(0); ; seq++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		m := []byte{8, 0, 0, 0, byte(id >> 8), byte(id), byte(seq >> 8), byte(seq), 'l', 'a', 'c', 'e'}
		binary.BigEndian.PutUint16(m[2:], ^checksum(m))
		_ = unix.Sendto(p.fd, m, 0, dst) // an unreachable moment is what is measured
	}
}

func (p *Probe) pong(ctx context.Context, id uint16) {
	defer p.wg.Done()
	buf := make([]byte, 1500)
	for ctx.Err() == nil {
		n, _, err := unix.Recvfrom(p.fd, buf, 0)
		if err != nil || n < 20 {
			continue
		}
		icmp := buf[int(buf[0]&0x0f)*4 : n]
		if len(icmp) >= 8 && icmp[0] == 0 && binary.BigEndian.Uint16(icmp[4:]) == id {
			p.mu.Lock()
			p.replies = append(p.replies, time.Now())
			p.mu.Unlock()
		}
	}
}

func checksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return uint16(s)
}

func (p *Probe) fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.streamErr == nil && !p.stopping {
		p.streamErr = err
	}
}

func (p *Probe) isStopping() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stopping
}

// Err is what broke the stream (a reset, a timeout), if anything did.
func (p *Probe) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.streamErr
}

// Arrived counts the echo replies and stream reads since t.
func (p *Probe) Arrived(t time.Time) (replies, reads int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(since(p.replies, t)), len(since(p.reads, t))
}

// Outage is the longest time without an echo reply, and without a byte
// of the stream, between from and to (a silence running into either end
// counts to it).
func (p *Probe) Outage(from, to time.Time) (ping, stream time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return longestGap(p.replies, from, to), longestGap(p.reads, from, to)
}

func since(ts []time.Time, t time.Time) []time.Time {
	for i, x := range ts {
		if !x.Before(t) {
			return ts[i:]
		}
	}
	return nil
}

// longestGap is the longest interval between consecutive times of ts
// (ascending) inside [from, to], the last one before from and to itself
// included as ends.
func longestGap(ts []time.Time, from, to time.Time) time.Duration {
	last := from
	for _, x := range ts {
		if x.Before(from) {
			last = x
		}
	}
	var gap time.Duration
	for _, x := range ts {
		if x.Before(from) || x.After(to) {
			continue
		}
		gap = max(gap, x.Sub(last))
		last = x
	}
	return max(gap, to.Sub(last))
}

// Stop ends the probe and closes what it opened; once (a second call
// would close a descriptor number someone else may hold by then).
func (p *Probe) Stop() {
	p.mu.Lock()
	if p.stopping {
		p.mu.Unlock()
		return
	}
	p.stopping = true
	p.mu.Unlock()
	if p.cancel != nil {
		p.cancel()
	}
	for _, c := range []net.Conn{p.guest, p.peer} {
		if c != nil {
			c.Close()
		}
	}
	if p.ln != nil {
		p.ln.Close()
	}
	p.wg.Wait()
	if p.fd >= 0 {
		unix.Close(p.fd)
	}
}
