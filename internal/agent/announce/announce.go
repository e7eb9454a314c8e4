package announce

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/model"
	"github.com/lace-cni/lace/internal/netutil"
)

// LeaseName is the heartbeat Lease of node's agent.
func LeaseName(node string) string { return "lace-agent-" + node }

// DataPlane is what the announcer needs of the eBPF data plane: which
// VIPs it answers ARP/NDP for. *datapath.Datapath implements it.
type DataPlane interface {
	SetAnnounced(vips []netip.Addr, mac net.HardwareAddr, ttl time.Duration) error
}

// ServiceLister lists the cluster's Services and EndpointSlices as the
// node's sync has them cached (nodesync.Syncer); they must not be
// modified.
type ServiceLister interface {
	ListServices(ctx context.Context) ([]*corev1.Service, []*discoveryv1.EndpointSlice, error)
}

// Options configure the announcer.
type Options struct {
	NodeName string
	// NetNS is the path of the node's network namespace, whose
	// UnderlayInterface carries the announcements.
	NetNS             string
	UnderlayInterface string
	// LeaseNamespace holds the agents' heartbeat Leases; LeaseDuration
	// is how long a silent agent counts as alive.
	LeaseNamespace string
	LeaseDuration  time.Duration
	// RestartGrace is how long the others keep counting this node alive
	// after its agent stops for a restart, and its data plane keeps
	// answering for its VIPs meanwhile (0: no grace, a stop is a failure).
	// A node being taken out of service (leaving) gets none.
	RestartGrace time.Duration
}

// failLogEvery spaces the log lines of renewals that keep failing.
const failLogEvery = 30 * time.Second

// maxRestartGrace caps the grace a peer's Lease asks for, so that an
// agent cannot keep its node's VIPs past a restart's worth of time.
const maxRestartGrace = 2 * time.Minute

// New makes the node's announcer.
func New(o Options, log *slog.Logger, c client.Client, reader client.Reader, dp DataPlane, services ServiceLister) *Announcer {
	return &Announcer{opts: o, log: log, client: c, reader: reader, dp: dp, services: services,
		ns: o.LeaseNamespace, duration: o.LeaseDuration, send: netutil.SendFrames, now: time.Now}
}

// Announcer keeps the node's share of the L2 announcements: it renews the
// agent's Lease (its heartbeat), sees which agents renew theirs, decides
// with model.Announcements which VIPs are this node's, has the data plane
// answer ARP/NDP for exactly those, and announces each one it takes over
// with gratuitous ARP / unsolicited NA. A node is alive while its Lease
// changed within the lease duration as this agent saw it (its own clock,
// not the writer's: no trust in clock sync). An agent that cannot renew
// its own Lease stops announcing at the same deadline the others take
// over, and the data plane's entries lapse by themselves if it dies.
type Announcer struct {
	opts     Options
	log      *slog.Logger
	client   client.Client
	reader   client.Reader
	dp       DataPlane
	services ServiceLister
	ns       string
	duration time.Duration
	mac      net.HardwareAddr

	mu      sync.Mutex
	seen    map[string]leaseSeen // node -> its Lease's last change, locally
	renewed time.Time            // own Lease's last successful renewal
	// took is how long that renewal waited for its answer: written on
	// the Lease for the peers, and part of the credit each peer's
	// silence gets here (waitCredit).
	took time.Duration
	// lease is the own Lease as this agent last wrote it (nil: read it
	// from the API server first).
	lease *coordinationv1.Lease
	// lagging is set while the cache is more than a duration behind the
	// own renewals (logged when it starts and ends).
	lagging bool
	lastTry time.Time
	lastOK  bool
	// lapseWaits is the latest lapse, by this agent's clock, of the peers
	// the last look at the Leases found lapsed but held alive by the
	// cache's freshness alone (zero: none). One renewal after it is all
	// they wait for; a cache behind by more than that needs none more.
	lapseWaits time.Time
	// lastFailLog is when a failed renewal was last logged, lastSlowLog
	// a slow one.
	lastFailLog time.Time
	lastSlowLog time.Time
	lastDown    time.Time
	// peerAlive is what the last look at the Leases found, so that a
	// peer's lapse and return are logged once each.
	peerAlive map[string]bool
	announced map[netip.Addr]bool
	// blind is set while the API server is out of reach (announcements
	// kept as they were) until the own Lease is renewed again.
	blind bool
	// groups are the underlay's solicited-node groups (netutil's
	// GroupMember once Run starts); send puts frames on the underlay
	// (netutil.SendFrames). Tests replace both.
	groups interface{ Set([]netip.Addr) error }
	send   func(nsPath, ifName string, frames [][]byte) error
	now    func() time.Time
}

type leaseSeen struct {
	renew string // the Lease's renewTime as written
	at    time.Time
	// stale: first seen with a renewTime already older than its grace
	// (by this node's clock): a grace left behind, not honoured again.
	stale bool
	// lapsed: judged silent past its grace. Final until the Lease is
	// renewed again: the credit for slow answers (see alive) grows and
	// shrinks with the API server's latency, and must not revive a
	// peer already taken over.
	lapsed bool
}

// tick is how often announcements are decided: a few times per lease
// duration, so a takeover follows an expiry closely.
func (an *Announcer) tick() time.Duration { return an.duration / 8 }

// Run announces until ctx ends.
func (an *Announcer) Run(ctx context.Context) error {
	err := netutil.Do(an.opts.NetNS, func() error {
		iface, err := net.InterfaceByName(an.opts.UnderlayInterface)
		if err == nil {
			an.mac = iface.HardwareAddr
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("underlay interface for L2 announcements: %w", err)
	}
	groups, err := netutil.NewGroupMember(an.opts.NetNS, an.opts.UnderlayInterface)
	if err != nil {
		return err
	}
	defer groups.Close()
	an.groups = groups
	an.seen, an.announced = map[string]leaseSeen{}, map[netip.Addr]bool{}
	t := time.NewTicker(an.tick())
	defer t.Stop()
	for {
		if err := an.once(ctx); err != nil {
			an.log.Error("L2 announcement", "err", err)
		}
		select {
		case <-ctx.Done():
			an.handOver()
			return nil
		case <-t.C:
		}
	}
}

// handOver, as the agent stops, asks the others for a restart's grace
// (AnnotationRestartGrace, with a renewal they see) and has the data
// plane keep answering for the VIPs as long: the next agent takes them
// on without any moving. An agent that cannot write it, or whose node is
// cordoned, leaves its Lease to lapse (a failover).
func (an *Announcer) handOver() {
	an.mu.Lock()
	defer an.mu.Unlock()
	if an.opts.RestartGrace <= 0 || len(an.announced) == 0 {
		return
	}
	if an.blind {
		an.log.Info("stopping without a restart grace while the API server is out of reach: the VIPs fail over", "vips", len(an.announced))
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), an.duration)
	defer cancel()
	// The node as the API server has it now, not as the cache had it.
	var node corev1.Node
	if err := an.reader.Get(ctx, client.ObjectKey{Name: an.opts.NodeName}, &node); err != nil || leaving(&node) {
		an.log.Info("stopping without a restart grace: the VIPs fail over", "leaving", leaving(&node), "err", err)
		return
	}
	grace := min(an.opts.RestartGrace, maxRestartGrace)
	if err := an.writeLease(ctx, an.now(), grace.String()); err != nil {
		an.log.Info("stopping without a restart grace: the VIPs fail over", "err", err)
		return
	}
	keep := make([]netip.Addr, 0, len(an.announced))
	for v := range an.announced {
		keep = append(keep, v)
	}
	if err := an.dp.SetAnnounced(keep, an.mac, grace); err != nil {
		an.log.Error("keep answering for the VIPs through the restart", "err", err)
		return
	}
	an.log.Info("stopping for a restart: the VIPs stay here", "grace", grace, "vips", len(keep))
}

// renew writes the own Lease's renewTime (creating the Lease the first
// time), at most every quarter duration.
func (an *Announcer) renew(ctx context.Context, now time.Time, force bool) bool {
	if !force && now.Sub(an.lastTry) < an.duration/4 {
		return an.lastOK
	}
	an.lastTry = now
	// A renewal later than a duration is no renewal: a request on a
	// connection the fabric lost would otherwise hang the ticks until the
	// transport notices (45 s in a 30 s cut), and no outage be seen.
	ctx, cancel := context.WithTimeout(ctx, an.duration)
	defer cancel()
	// Back from a restart: the grace is over.
	err := an.writeLease(ctx, now, "")
	// A renewal that waited half the lease or more (to its answer or its
	// timeout) brings a takeover near: the API server's latency, or this
	// agent starved of CPU, shows here before a VIP moves for it.
	if took := an.now().Sub(now); took >= an.duration/2 && now.Sub(an.lastSlowLog) >= failLogEvery {
		an.log.Info("slow agent lease renewal", "took", took.String(), "duration", an.duration.String(), "err", err)
		an.lastSlowLog = now
	}
	if err != nil {
		// Through an outage a failure comes every other tick: logged when
		// renewals start failing, then every failLogEvery.
		if an.lastOK || now.Sub(an.lastFailLog) >= failLogEvery {
			an.log.Info("renew the agent lease", "err", err)
			an.lastFailLog = now
		}
		an.lastOK = false
		return false
	}
	an.renewed, an.lastOK, an.took = now, true, an.now().Sub(now)
	return true
}

// writeLease renews the own Lease at now, with the restart grace
// annotation set to grace ("" removes it). It updates the Lease as this
// agent last wrote it, never as its cache has it: a loaded API server's
// watch lags behind its writes by seconds, and an update from the cache
// then conflicts at every renewal, which let the Lease lapse under load
// (the VIP moved to a node whose cache was as late, and back). A
// conflict (someone else wrote it, or the agent restarted) reads it
// again from the API server itself, once.
func (an *Announcer) writeLease(ctx context.Context, now time.Time, grace string) error {
	err := an.updateLease(ctx, now, grace)
	if apierrors.IsConflict(err) {
		an.lease = nil
		err = an.updateLease(ctx, now, grace)
	}
	return err
}

func (an *Announcer) updateLease(ctx context.Context, now time.Time, grace string) error {
	name := LeaseName(an.opts.NodeName)
	l, create := an.lease, false
	if l == nil {
		l = &coordinationv1.Lease{}
		err := an.reader.Get(ctx, client.ObjectKey{Namespace: an.ns, Name: name}, l)
		if apierrors.IsNotFound(err) {
			l, create = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: an.ns, Name: name}}, true
		} else if err != nil {
			return err
		}
	}
	l = l.DeepCopy()
	// Whoever changed the Lease meanwhile, it speaks for this node again.
	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	l.Labels[lacev1.LabelAgentLease] = "true"
	l.Spec.HolderIdentity = ptr.To(an.opts.NodeName)
	l.Spec.LeaseDurationSeconds = ptr.To(int32((an.duration + time.Second - 1) / time.Second))
	l.Spec.RenewTime = &metav1.MicroTime{Time: now}
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	if grace != "" {
		l.Annotations[lacev1.AnnotationRestartGrace] = grace
	} else {
		delete(l.Annotations, lacev1.AnnotationRestartGrace)
	}
	l.Annotations[lacev1.AnnotationRenewWait] = an.took.Round(time.Millisecond).String()
	var err error
	if create {
		err = an.client.Create(ctx, l)
	} else {
		err = an.client.Update(ctx, l)
	}
	if err != nil {
		return err
	}
	an.lease = l
	return nil
}

// apiDown tells whether the API server cannot be reached at all (not
// merely this Lease refused).
func (an *Announcer) apiDown(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, an.duration/4)
	defer cancel()
	var l coordinationv1.LeaseList
	err := an.reader.List(ctx, &l, client.InNamespace(an.ns), client.Limit(1))
	return err != nil && !apierrors.IsForbidden(err) && !apierrors.IsNotFound(err)
}

// fresh is how far the cache is known current: the own Lease's
// renewTime it shows, a time this agent wrote by its own clock. Watch
// events come in order, so every peer's renewal made before that one is
// in the cache too; after it, the cache proves nothing. Zero before the
// own first renewal shows.
func (an *Announcer) fresh(leases []coordinationv1.Lease, now time.Time) time.Time {
	var f time.Time
	for _, l := range leases {
		if l.Name == LeaseName(an.opts.NodeName) && l.Spec.RenewTime != nil {
			f = l.Spec.RenewTime.Time
		}
	}
	lagging := now.Sub(an.renewed) < an.duration && now.Sub(f) > an.duration
	if lagging != an.lagging {
		an.lagging = lagging
		an.log.Info("the cache's view of the agent Leases", "behind", now.Sub(f).String(), "lagging", lagging)
	}
	return f
}

// alive is the set of nodes whose agents renewed their Lease within the
// duration, as seen from here.
func (an *Announcer) alive(ctx context.Context, now time.Time) (map[string]bool, error) {
	var leases coordinationv1.LeaseList
	if err := an.client.List(ctx, &leases, client.InNamespace(an.ns), client.MatchingLabels{lacev1.LabelAgentLease: "true"}); err != nil {
		return nil, fmt.Errorf("list agent leases: %w", err)
	}
	// A peer's silence counts only as far as the cache is known current:
	// a watch seconds behind (a loaded API server), or dead until the next
	// request notices its connection was lost (a fabric cut), shows
	// silence that is the cache's, not the peer's.
	judged := now
	if f := an.fresh(leases.Items, now); f.Before(now) {
		judged = f
	}
	an.lapseWaits = time.Time{}
	out := map[string]bool{}
	for _, l := range leases.Items {
		// A Lease speaks for the node its name says, and only when its
		// holder says the same: one agent cannot keep another node alive
		// under its own name.
		node, ok := strings.CutPrefix(l.Name, LeaseName(""))
		if !ok || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != node || l.Spec.RenewTime == nil {
			continue
		}
		renew := l.Spec.RenewTime.Format(time.RFC3339Nano)
		s, ok := an.seen[node]
		switch {
		case !ok:
			// First sight (this agent just started): alive for a full
			// duration from now, whatever the writer's clock says, so a
			// restart never declares a live peer dead.
			s = leaseSeen{renew: renew, at: now, stale: now.Sub(l.Spec.RenewTime.Time) >= an.grace(&l)}
		case s.renew != renew:
			s = leaseSeen{renew: renew, at: now}
		}
		an.seen[node] = s
		g := an.grace(&l)
		if s.stale {
			g = an.duration
		}
		// The silence a peer is allowed: its grace and the credit for
		// slow answers, for the lapse and for the forced renewal alike.
		g += an.waitCredit(&l)
		if s.lapsed || judged.Sub(s.at) >= g {
			s.lapsed = true
			an.seen[node] = s
			continue
		}
		out[node] = true
		if now.Sub(s.at) >= g && s.at.Add(g).After(an.lapseWaits) {
			an.lapseWaits = s.at.Add(g)
		}
	}
	out[an.opts.NodeName] = now.Sub(an.renewed) < an.duration
	an.logLapses(out, now, judged)
	return out, nil
}

// waitCredit is how much past its grace a peer's silence is forgiven. A
// peer renews again only once its last renewal answered: while the API
// server answers slowly (a loaded machine: 1.6 s of a 2 s Lease in CI;
// or the peer's own path to it, delayed), its renewals land that much
// further apart than a quarter duration, and a live peer looked silent
// for a moment past the duration. The credit is the slower of the
// peer's last wait (AnnotationRenewWait, which shows a path slow for it
// alone) and this agent's own (which shows at once a slowdown of the
// API server for everyone, before the peer's next renewal can say so),
// capped at a duration, where a renewal times out: a dead peer is taken
// over later by as much, never by more.
func (an *Announcer) waitCredit(l *coordinationv1.Lease) time.Duration {
	credit := an.took
	if d, err := time.ParseDuration(l.Annotations[lacev1.AnnotationRenewWait]); err == nil && d > credit {
		credit = d
	}
	return min(credit, an.duration)
}

// logLapses logs each peer whose Lease lapsed, or is renewed again,
// since the last look: the reason any VIP moves.
func (an *Announcer) logLapses(alive map[string]bool, now, judged time.Time) {
	if an.peerAlive == nil {
		an.peerAlive = map[string]bool{}
	}
	for node, s := range an.seen {
		was, known := an.peerAlive[node]
		an.peerAlive[node] = alive[node]
		switch {
		case node == an.opts.NodeName || !known || was == alive[node]:
		case alive[node]:
			an.log.Info("agent Lease renewed again", "peer", node)
		default:
			an.log.Info("agent Lease lapsed", "peer", node, "silentFor", now.Sub(s.at).String(),
				"cacheBehind", now.Sub(judged).String())
		}
	}
}

// leaving tells that a node is being taken out of service, so no agent
// will follow the one stopping there soon: cordoned, labelled to keep the
// agent off (lacev1.LabelAgentStopped), not Ready (the
// kubelet's graceful node shutdown marks it so), or tainted not-ready,
// unreachable or out-of-service.
func leaving(n *corev1.Node) bool {
	// The chart's affinity keeps the agent off a node so labelled: no
	// successor comes.
	if n.Spec.Unschedulable || n.Labels[lacev1.LabelAgentStopped] != "" {
		return true
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status != corev1.ConditionTrue {
			return true
		}
	}
	for _, t := range n.Spec.Taints {
		switch t.Key {
		case corev1.TaintNodeNotReady, corev1.TaintNodeUnreachable, corev1.TaintNodeOutOfService:
			return true
		}
	}
	return false
}

// grace is how long a node counts as alive after its Lease last changed:
// the lease duration, or the restart grace its agent asked for as it
// stopped (capped).
func (an *Announcer) grace(l *coordinationv1.Lease) time.Duration {
	d, err := time.ParseDuration(l.Annotations[lacev1.AnnotationRestartGrace])
	if err != nil || d <= an.duration {
		return an.duration
	}
	return min(d, maxRestartGrace)
}

func (an *Announcer) once(ctx context.Context) error {
	an.mu.Lock()
	defer an.mu.Unlock()
	now := an.now()
	start := now
	var classes lacev1.LoadBalancerClassList
	if err := an.client.List(ctx, &classes, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("list LoadBalancerClasses: %w", err)
	}
	// No class, nothing to announce: no heartbeat either (the API server
	// pays for every node's renewals only where L2 announcement is used).
	if len(classes.Items) == 0 && len(an.announced) == 0 {
		return nil
	}
	renewed := an.renew(ctx, now, false)
	if ctx.Err() != nil {
		// Stopping: a renewal the stop cut short says nothing of the
		// API server. Taken for an outage, it made the agent blind and
		// handOver then asked no restart grace: the VIP moved on every
		// rolling restart that stopped an agent mid-renewal.
		return nil
	}
	down := !renewed && an.apiDown(ctx)
	if down {
		// When the check answered: a tick whose renewal hung began up to
		// a duration and a quarter earlier, and stamped with its start the outage
		// would look over at the next tick, whose renewal fails as well.
		an.lastDown = an.now()
	}
	if down || (!renewed && an.blind && now.Sub(an.lastDown) < an.duration) {
		// The API server is out of reach for this node: fail static, at
		// once. What this agent reads meanwhile (its cache) is stale, so
		// no peer's silence is evidence: deciding on it would take over
		// a peer's VIPs a tick before this node's own Lease lapses too,
		// and move every VIP (resetting what the external clients hold)
		// when the API returns. If it is down for everyone nobody takes
		// over, and withdrawing would take every VIP off the network; if
		// only this node is cut off, another takes over and both answer
		// until it is back (the data planes of both serve the VIP).
		if !an.blind {
			an.log.Info("API server unreachable: keeping the announcements", "vips", len(an.announced))
		}
		an.blind = true
		keep := make([]netip.Addr, 0, len(an.announced))
		for v := range an.announced {
			keep = append(keep, v)
		}
		return an.dp.SetAnnounced(keep, an.mac, an.duration)
	}
	// The renewal may have waited for the API server up to its timeout (a
	// duration): peers are judged from when it returned, and the own
	// entries' lifetime below counts from then too (shorter by the wait:
	// never past the moment peers may take over). Judged from the
	// tick's start, the first sight after an outage was stamped up to a
	// duration early, and a peer whose own renewal the cache did not show
	// yet was taken for dead a moment after the return.
	now = an.now()
	if an.blind {
		// Back: every peer gets a full duration from now to renew, as at
		// first sight, since none could while the API server was down.
		an.log.Info("API server reachable again: peers get a lease duration to renew before any takeover")
		an.seen, an.blind = map[string]leaseSeen{}, false
		clear(an.peerAlive)
	}
	alive, err := an.alive(ctx, now)
	if err != nil {
		return err
	}
	if !an.lapseWaits.IsZero() && !an.renewed.After(an.lapseWaits) && an.lastTry.Before(start) {
		// A peer's Lease has lapsed and only the cache's freshness holds
		// it alive: renew now, and the next tick judges it with this
		// renewal in the cache, instead of after the next one on the
		// quarter-duration cadence (up to a quarter duration later).
		an.renew(ctx, an.now(), true)
		// The entries' lifetime below counts from after the wait, as
		// for the renewal above.
		now = an.now()
	}
	in := model.AnnounceInput{Alive: alive}
	var nodes corev1.NodeList
	if err := an.client.List(ctx, &nodes, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("list Nodes: %w", err)
	}
	in.Classes, in.Nodes = classes.Items, make([]*corev1.Node, len(nodes.Items))
	for i := range nodes.Items {
		in.Nodes[i] = &nodes.Items[i]
	}
	svcs, slices, err := an.services.ListServices(ctx)
	if err != nil {
		return err
	}
	in.Services, in.Slices = svcs, onlyLB(svcs, slices)
	var mine []netip.Addr
	for _, a := range model.Announcements(in) {
		if a.Node == an.opts.NodeName {
			mine = append(mine, a.VIP)
		}
	}
	// The entries lapse when the others stop counting this node alive:
	// at the own Lease's last renewal plus the duration (they see the
	// renewal no earlier than it was made).
	ttl := an.renewed.Add(an.duration).Sub(now)
	if ttl <= 0 {
		mine, ttl = nil, 0
	}
	if err := an.dp.SetAnnounced(mine, an.mac, ttl); err != nil {
		return err
	}
	// Solicitations for an IPv6 VIP go to its solicited-node group: the
	// underlay joins it, or a multicast filter (the NIC's, an MLD-snooping
	// switch's) would keep them from ever reaching the data plane.
	var groups []netip.Addr
	for _, v := range mine {
		if v.Is6() {
			groups = append(groups, netutil.SolicitedNode(v))
		}
	}
	if err := an.groups.Set(groups); err != nil {
		an.log.Error("solicited-node groups of IPv6 VIPs", "err", err)
	}
	var taken []netip.Addr
	now2 := map[netip.Addr]bool{}
	for _, v := range mine {
		now2[v] = true
		if !an.announced[v] {
			taken = append(taken, v)
			an.log.Info("announcing LoadBalancer VIP", "vip", v)
		}
	}
	for v := range an.announced {
		if !now2[v] {
			an.log.Info("stopped announcing LoadBalancer VIP", "vip", v)
		}
	}
	an.announced = now2
	if len(taken) > 0 {
		go an.burst(taken)
	}
	return nil
}

// onlyLB keeps the slices of LoadBalancer Services (the only ones whose
// endpoints decide an announcement).
func onlyLB(svcs []*corev1.Service, all []*discoveryv1.EndpointSlice) []*discoveryv1.EndpointSlice {
	lb := map[model.ServiceKey]bool{}
	for _, s := range svcs {
		if s.Spec.Type == corev1.ServiceTypeLoadBalancer {
			lb[model.ServiceKey{Namespace: s.Namespace, Name: s.Name}] = true
		}
	}
	var out []*discoveryv1.EndpointSlice
	for _, sl := range all {
		if k, ok := model.SliceService(sl); ok && lb[k] {
			out = append(out, sl)
		}
	}
	return out
}

// burst announces taken VIPs a few times (a frame can be lost, a switch
// can be learning): gratuitous ARP for IPv4, unsolicited NA for IPv6.
func (an *Announcer) burst(vips []netip.Addr) {
	var frames [][]byte
	for _, v := range vips {
		if v.Is4() {
			frames = append(frames, netutil.GratuitousARP(an.mac, v))
		} else {
			frames = append(frames, netutil.UnsolicitedNA(an.mac, v))
		}
	}
	for i, wait := range []time.Duration{0, 200 * time.Millisecond, 800 * time.Millisecond} {
		time.Sleep(wait)
		if err := an.send(an.opts.NetNS, an.opts.UnderlayInterface, frames); err != nil {
			an.log.Error("announce takeover", "vips", vips, "round", i, "err", err)
			return
		}
	}
}
