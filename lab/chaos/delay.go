package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/lab"
)

// This kernel has neither sch_netem nor sch_fq (which could delay by
// timestamps), and its nftables cannot queue to user space. A node's
// fabric port is delayed the way a netem qdisc would, in user space: the
// port leaves the fabric bridge, and a relay carries every frame between
// it and a veth pair that joins the bridge in its place, each frame held
// for the delay. Packet sockets with virtio-net headers carry
// offloaded (GSO) frames whole, so nothing exceeds an MTU on the way.

// fabricDelayOneWay is added to every frame each way: a round trip gains
// twice it, as between two sites.
const fabricDelayOneWay = 50 * time.Millisecond

// fabricDelay delays a node's frames on the fabric for a minute.
func fabricDelay(ctx context.Context, h *harness, w *workload) error {
	node := h.randomNode()
	d, err := startDelay(netutil.Path(h.cfg.NetNS("fabric")), node, fabricDelayOneWay)
	if err != nil {
		return err
	}
	h.printf("  %s's frames delayed %s each way on the fabric for 60s", node, fabricDelayOneWay)
	// A question from another node to a pod on this one crosses its port
	// both ways: proof that the delay is there.
	rtt, rttErr := w.askTimed(ctx, node)
	sleep(ctx, time.Minute)
	relayed, err := d.stop()
	if err == nil {
		err = rttErr
	}
	if err != nil {
		return err
	}
	h.printf("  %d frames relayed late; a question across it took %s", relayed, rtt.Round(time.Millisecond))
	if rtt < 2*fabricDelayOneWay {
		return fmt.Errorf("a question across the delayed port took %s, less than the delay", rtt)
	}
	if relayed == 0 {
		return errors.New("the delay relayed no frame: the node was cut off, not delayed")
	}
	return h.converge(ctx)
}

// askTimed asks a pod on node one UDP question from a client on another
// node and returns how long the answer took.
func (w *workload) askTimed(ctx context.Context, node string) (time.Duration, error) {
	from := w.nodes[0]
	if from == node {
		from = w.nodes[1]
	}
	ns, err := lab.PodNetNS(ctx, w.h.cfg, Namespace, "cli-d-"+from)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	if !askUDP(ctx, ns, netip.AddrPortFrom(podAddr(w.pods["web-"+node], false), udpPort)) {
		return 0, fmt.Errorf("cli-d-%s -> web-%s: no answer through the delay", from, node)
	}
	return time.Since(start), nil
}

// delayLink is one node's port taken off the fabric bridge and relayed
// to it late.
type delayLink struct {
	ns, port, bridgeEnd, relayEnd string
	fds                           [2]int
	done                          chan struct{}
	wg                            sync.WaitGroup
	mu                            sync.Mutex
	relayed                       int
	errs                          []error
}

// startDelay puts a relay delaying each frame by d between port (a node's
// port on the fabric bridge, in the namespace at ns) and the bridge.
func startDelay(ns, port string, d time.Duration) (*delayLink, error) {
	l := &delayLink{ns: ns, port: port, bridgeEnd: "dly-" + port, relayEnd: "dlr-" + port, done: make(chan struct{})}
	info, err := netutil.GetLink(ns, port)
	if err != nil {
		return nil, err
	}
	if err := netutil.EnsureVeth(netutil.VethSpec{NSPath: ns, Name: l.bridgeEnd, Master: fabricBridge,
		PeerNSPath: ns, PeerName: l.relayEnd, MTU: info.MTU}); err != nil {
		_ = netutil.DeleteLink(ns, l.bridgeEnd)
		return nil, err
	}
	for i, ifName := range []string{port, l.relayEnd} {
		if l.fds[i], err = packetSocket(ns, ifName); err != nil {
			l.cleanup()
			return nil, err
		}
	}
	if err := setMaster(ns, port, ""); err != nil {
		l.cleanup()
		return nil, err
	}
	l.relay(l.fds[0], l.fds[1], d)
	l.relay(l.fds[1], l.fds[0], d)
	return l, nil
}

// fabricBridge is the lab's fabric bridge (lab.setupNetwork).
const fabricBridge = "br0"

// stop puts the port back on the bridge, stops the relay and removes it,
// and returns how many frames it relayed.
func (l *delayLink) stop() (int, error) {
	// The relay first: a port on the bridge and in the relay at once
	// would show the node's MACs on two ports of the bridge.
	close(l.done)
	l.wg.Wait()
	err := setMaster(l.ns, l.port, fabricBridge)
	l.cleanup()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.relayed, errors.Join(append(l.errs, err)...)
}

func (l *delayLink) cleanup() {
	for _, fd := range l.fds {
		if fd > 0 {
			unix.Close(fd)
		}
	}
	_ = netutil.DeleteLink(l.ns, l.bridgeEnd)
}

// late is a frame and when it may leave.
type late struct {
	at    time.Time
	frame []byte
}

// relay reads every frame arriving on from and writes it to to once d has
// passed. Frames keep their order: each waits the same time.
func (l *delayLink) relay(from, to int, d time.Duration) {
	q := make(chan late, 1<<14)
	l.wg.Add(2)
	go func() {
		defer l.wg.Done()
		defer close(q)
		wireThread()
		buf := make([]byte, 1<<16+64)
		for {
			select {
			case <-l.done:
				return
			default:
			}
			n, _, err := unix.Recvfrom(from, buf, 0)
			if err != nil {
				if err != unix.EAGAIN && err != unix.EINTR {
					l.fail(fmt.Errorf("read a frame: %w", err))
					return
				}
				continue
			}
			select {
			case q <- late{time.Now().Add(d), append([]byte(nil), buf[:n]...)}:
			default: // a full queue drops, as a qdisc's limit does
			}
		}
	}()
	go func() {
		defer l.wg.Done()
		wireThread()
		for f := range q {
			if wait := time.Until(f.at); wait > 0 {
				time.Sleep(wait)
			}
			if _, err := unix.Write(to, f.frame); err != nil {
				// The port may be back on the bridge and down for a
				// moment; a frame lost then is a frame lost.
				continue
			}
			l.mu.Lock()
			l.relayed++
			l.mu.Unlock()
		}
	}()
}

// wireThread gives the calling goroutine a thread of its own that runs
// ahead of the machine's other work (nice -10; the harness is root), for
// the rest of the goroutine's life (the thread ends with it): the relay is
// the wire, and a relay starved by a loaded machine (the test tiers
// beside the chaos in make test) would delay frames by the load, not d,
// and fail the fault for what it did not do.
func wireThread() {
	runtime.LockOSThread()
	_ = unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), -10)
}

func (l *delayLink) fail(err error) {
	l.mu.Lock()
	l.errs = append(l.errs, err)
	l.mu.Unlock()
}

// packetSocket opens a raw packet socket on ifName, in the namespace at
// ns, that reads frames arriving there (not those it sends) with their
// virtio-net header, and writes frames the same way.
func packetSocket(ns, ifName string) (int, error) {
	proto := int(htons(unix.ETH_P_ALL))
	var fd int
	err := netutil.Do(ns, func() error {
		var err error
		if fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, proto); err != nil {
			return fmt.Errorf("packet socket: %w", err)
		}
		iface, err := net.InterfaceByName(ifName)
		if err == nil {
			err = errors.Join(
				unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_VNET_HDR, 1),
				unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 1),
				unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: uint16(proto), Ifindex: iface.Index}))
		}
		if err != nil {
			unix.Close(fd)
			return fmt.Errorf("packet socket on %s: %w", ifName, err)
		}
		return nil
	})
	if err != nil {
		return -1, err
	}
	tv := unix.NsecToTimeval((100 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// setMaster puts link on bridge, or takes it off any ("").
func setMaster(ns, link, bridge string) error {
	return onLink(ns, link, func(hd *netlink.Handle, l netlink.Link) error {
		if bridge == "" {
			return hd.LinkSetNoMaster(l)
		}
		br, err := hd.LinkByName(bridge)
		if err != nil {
			return fmt.Errorf("bridge %s: %w", bridge, err)
		}
		return hd.LinkSetMaster(l, br)
	})
}
