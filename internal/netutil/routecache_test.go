package netutil

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TestOwnedRouteCache: while its route and link events say nothing
// changed Lace's routes, a reconcile's listing comes from the cache; an
// owned route added or deleted by anyone, a change of the underlay link,
// a write of the agent's own, or the listing's age lists them again. A
// route of someone else's does not.
func TestOwnedRouteCache(t *testing.T) {
	node := testNS(t, "lorc")
	path := Path(node)
	err := Do(path, func() error {
		la := netlink.NewLinkAttrs()
		la.Name = "ul"
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "ulpeer"}); err != nil {
			return err
		}
		for _, name := range []string{"ul", "ulpeer"} {
			l, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
		}
		l, _ := netlink.LinkByName("ul")
		addr, _ := netlink.ParseAddr("fd00:78::1/64")
		addr.Flags = unix.IFA_F_NODAD
		return netlink.AddrAdd(l, addr)
	})
	if err != nil {
		t.Fatal(err)
	}
	n, err := OpenNS(path)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	var lists atomic.Int32
	list := func() (map[netip.Prefix]netip.Addr, error) {
		lists.Add(1)
		return n.OwnedRoutes()
	}
	c := NewOwnedRouteCache()
	clock := time.Now()
	c.now = func() time.Time { return clock }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go c.Watch(ctx, path, "ul", slog.New(slog.NewTextHandler(io.Discard, nil)))
	waitUntil(t, "the subscriptions run", func() bool { return c.live.Load() })

	get := func() map[netip.Prefix]netip.Addr {
		t.Helper()
		r, err := c.Get(list)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// steady waits until a read lists nothing (the events of what came
	// before may still come in), then finds that reads list nothing
	// while nothing happens.
	steady := func(what string) {
		t.Helper()
		waitUntil(t, what+": a read from the cache", func() bool {
			before := lists.Load()
			get()
			return lists.Load() == before
		})
		before := lists.Load()
		for range 5 {
			get()
		}
		if d := lists.Load() - before; d != 0 {
			t.Fatalf("%s: %d listings with nothing changed, want 0", what, d)
		}
	}
	hop := netip.MustParseAddr("fd00:78::9")
	dst := netip.MustParsePrefix("fd00:99::/64")
	steady("at start")

	// Someone else's owned route (an agent before a restart, an
	// operator): listed again, and found.
	if err := n.ReplaceOwnedRoute(dst, hop, "ul"); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the new owned route listed", func() bool { _, ok := get()[dst]; return ok })
	steady("after the route came")

	// A route that is not Lace's: no listing (its event, and a pod
	// veth's, are told apart in TestOwnedRouteEvents).
	other := &netlink.Route{Dst: &net.IPNet{IP: net.ParseIP("fd00:98::"), Mask: net.CIDRMask(64, 128)}, Gw: hop.AsSlice(),
		LinkIndex: mustIndex(t, n, "ul")}
	if err := n.h.RouteAdd(other); err != nil {
		t.Fatal(err)
	}
	// Its event is in the channel before the deletion's below; one
	// listing there would be the deletion's.
	steady("after another's route")

	// Deleted by someone else: listed again, and gone.
	if err := DeleteRoute(path, dst, ""); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the deleted owned route gone", func() bool { _, ok := get()[dst]; return !ok })
	steady("after the route went")

	// The underlay losing an address (the kernel flushes the IPv4
	// routes through a link that lost its last IPv4 address, with no
	// event per route): listed again.
	before := lists.Load()
	if err := n.h.AddrDel(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "ul", Index: mustIndex(t, n, "ul")}},
		&netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP("fd00:78::1"), Mask: net.CIDRMask(64, 128)}}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "a listing after the underlay lost an address", func() bool { get(); return lists.Load() > before })

	// The underlay link taken down flushes IPv4 routes without an event
	// of their own: its event lists again.
	steady("after the address")
	before = lists.Load()
	if err := n.h.LinkSetDown(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "ul", Index: mustIndex(t, n, "ul")}}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "a listing after the link went down", func() bool { get(); return lists.Load() > before })

	// The agent's own write lists again at once, before its event.
	steady("after the link")
	before = lists.Load()
	c.Changed()
	get()
	if lists.Load() != before+1 {
		t.Error("Changed did not list again")
	}

	// No listing is trusted past its age.
	steady("after Changed")
	before = lists.Load()
	clock = clock.Add(ownedRouteMaxAge)
	get()
	if lists.Load() != before+1 {
		t.Error("a listing older than ownedRouteMaxAge was trusted")
	}

	// Without the subscriptions, every Get lists.
	cancel()
	waitUntil(t, "the subscriptions end", func() bool { return !c.live.Load() })
	before = lists.Load()
	get()
	get()
	if d := lists.Load() - before; d != 2 {
		t.Errorf("unwatched: %d listings for 2 reads, want 2", d)
	}
}

func mustIndex(t *testing.T, n *NS, name string) int {
	t.Helper()
	l, err := n.h.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return l.Attrs().Index
}

func waitUntil(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5 s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestOwnedRouteEvents: which events mark the cache dirty.
func TestOwnedRouteEvents(t *testing.T) {
	for _, c := range []struct {
		proto netlink.RouteProtocol
		want  bool
	}{{RouteProto, true}, {unix.RTPROT_KERNEL, false}, {unix.RTPROT_BOOT, false}, {unix.RTPROT_STATIC, false}} {
		if got := ownedRouteEvent(netlink.RouteUpdate{Route: netlink.Route{Protocol: c.proto}}); got != c.want {
			t.Errorf("a route of protocol %d: dirty %t, want %t", c.proto, got, c.want)
		}
	}
	veth := func(name string) netlink.LinkUpdate {
		return netlink.LinkUpdate{Link: &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}}}
	}
	if !linkEvent(veth("ul"), "ul") {
		t.Error("the underlay link's event did not mark the cache dirty")
	}
	if linkEvent(veth("lace1234abcd"), "ul") || linkEvent(netlink.LinkUpdate{}, "ul") {
		t.Error("a pod veth's event marked the cache dirty")
	}
}
