package netutil

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// OwnedRouteCache keeps the last listing of a namespace's owned routes
// (those marked RouteProto) for as long as nothing can have changed them,
// so that a reconcile that changes no route does not dump the routing
// table: with a thousand nodes that dump was 10% of a reconcile's CPU and
// most of its garbage. Nothing can have changed them while
//   - Watch's subscriptions to the namespace's route and link events run
//     and have seen no route marked RouteProto come or go, and no change
//     of the watched link (the kernel flushes IPv4 routes through a link
//     taken down without an event per route);
//   - this process wrote no route through it since, and no periodic
//     resync asked for a listing (Changed);
//   - the listing is younger than maxAge, a bound on anything missed.
//
// Otherwise Get lists them again.
type OwnedRouteCache struct {
	mu     sync.Mutex
	routes map[netip.Prefix]netip.Addr // nil: list again
	at     time.Time
	// dirty is set by every event that may have changed the owned
	// routes; live while the subscriptions run (never: always list).
	dirty, live atomic.Bool
	now         func() time.Time
}

// ownedRouteMaxAge bounds how long a listing is trusted, whatever the
// events said: as long as the agent's periodic resync.
const ownedRouteMaxAge = 30 * time.Second

// NewOwnedRouteCache is a cache that lists every time until Watch runs.
func NewOwnedRouteCache() *OwnedRouteCache { return &OwnedRouteCache{now: time.Now} }

// Get returns the owned routes (destination -> gateway), from the last
// listing when nothing can have changed them, else from list.
func (c *OwnedRouteCache) Get(list func() (map[netip.Prefix]netip.Addr, error)) (map[netip.Prefix]netip.Addr, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	// Swapped before listing: an event during the listing lists again
	// next time.
	dirty := c.dirty.Swap(false)
	if c.routes == nil || dirty || !c.live.Load() || c.now().Sub(c.at) >= ownedRouteMaxAge {
		at := c.now()
		r, err := list()
		if err != nil {
			c.routes = nil
			return nil, err
		}
		c.routes, c.at = r, at
	}
	return maps.Clone(c.routes), nil
}

// Changed tells the cache that this process wrote or deleted an owned
// route (or tried to), or that a periodic resync wants the kernel's own
// word: the next Get lists again. A write's own event would say so too,
// but may come after that Get.
func (c *OwnedRouteCache) Changed() {
	c.mu.Lock()
	c.routes = nil
	c.mu.Unlock()
}

// Watch subscribes to the route, link and address events of the
// namespace at nsPath until ctx ends, marking the cache dirty on each that
// may change the owned routes: a route marked RouteProto, or a change of
// link or of its addresses (the kernel flushes the IPv4 routes through a
// link taken down, or that lost its last IPv4 address, with no event per
// route). A subscription that fails or ends (a receive buffer overrun in
// a burst) leaves the cache listing every time until it is made again.
func (c *OwnedRouteCache) Watch(ctx context.Context, nsPath, link string, log *slog.Logger) {
	delay := time.Second
	for ctx.Err() == nil {
		began := time.Now()
		err := c.watchOnce(ctx, nsPath, link)
		if ctx.Err() != nil {
			return
		}
		// Backing off is for a subscription that keeps failing, not for
		// the overrun of a burst after an hour of quiet.
		if time.Since(began) > time.Minute {
			delay = time.Second
		}
		log.Info("route events of the node's namespace lost: listing Lace's routes at every reconcile until subscribed again",
			"err", err, "retryIn", delay.String())
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		delay = min(2*delay, time.Minute)
	}
}

func (c *OwnedRouteCache) watchOnce(ctx context.Context, nsPath, link string) error {
	defer c.live.Store(false)
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		return err
	}
	defer ns.Close()
	done := make(chan struct{})
	// Buffered so that a burst of pod routes does not hold the kernel's
	// socket full while the loop below catches up.
	routes := make(chan netlink.RouteUpdate, 1024)
	links := make(chan netlink.LinkUpdate, 256)
	addrs := make(chan netlink.AddrUpdate, 256)
	failed := make(chan error, 3)
	var subscribed []func()
	defer func() {
		close(done)
		for _, drain := range subscribed {
			go drain()
		}
	}()
	onErr := func(err error) {
		select {
		case failed <- err:
		default:
		}
	}
	if err := netlink.RouteSubscribeWithOptions(routes, done, netlink.RouteSubscribeOptions{Namespace: &ns, ErrorCallback: onErr}); err != nil {
		return err
	}
	subscribed = append(subscribed, drainer(routes))
	if err := netlink.LinkSubscribeWithOptions(links, done, netlink.LinkSubscribeOptions{Namespace: &ns, ErrorCallback: onErr}); err != nil {
		return err
	}
	subscribed = append(subscribed, drainer(links))
	if err := netlink.AddrSubscribeWithOptions(addrs, done, netlink.AddrSubscribeOptions{Namespace: &ns, ErrorCallback: onErr}); err != nil {
		return err
	}
	subscribed = append(subscribed, drainer(addrs))
	// The link's index tells its address events from the pods' veths';
	// unknown (0: no such link yet), every address event counts.
	index := 0
	if h, err := netlink.NewHandleAt(ns); err == nil {
		if l, err := h.LinkByName(link); err == nil {
			index = l.Attrs().Index
		}
		h.Close()
	}
	// Subscribed: anything before is covered by listing once more.
	c.dirty.Store(true)
	c.live.Store(true)
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-failed:
			c.dirty.Store(true)
			return err
		case u, ok := <-routes:
			if !ok {
				c.dirty.Store(true)
				return errSubscriptionClosed
			}
			if ownedRouteEvent(u) {
				c.dirty.Store(true)
			}
		case u, ok := <-links:
			if !ok {
				c.dirty.Store(true)
				return errSubscriptionClosed
			}
			if linkEvent(u, link) {
				index = u.Link.Attrs().Index
				c.dirty.Store(true)
			}
		case u, ok := <-addrs:
			if !ok {
				c.dirty.Store(true)
				return errSubscriptionClosed
			}
			if index == 0 || u.LinkIndex == index {
				c.dirty.Store(true)
			}
		}
	}
}

// ownedRouteEvent: a route marked as Lace's came, changed or went.
func ownedRouteEvent(u netlink.RouteUpdate) bool { return u.Route.Protocol == RouteProto }

// linkEvent: link changed (the pods' veths come and go all the time and
// carry no owned route).
func linkEvent(u netlink.LinkUpdate, link string) bool {
	return u.Link != nil && u.Link.Attrs().Name == link
}

// drainer empties ch until it is closed: a subscription's reader ends
// once its socket closes, and one blocked on a full channel needs it
// drained to see that.
func drainer[T any](ch <-chan T) func() {
	return func() {
		for range ch {
		}
	}
}

var errSubscriptionClosed = errors.New("netlink subscription closed")
