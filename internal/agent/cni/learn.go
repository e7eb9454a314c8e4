package cni

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/model"
	"github.com/lace-cni/lace/internal/model/ipam"
)

// Learning on l2 networks (spec.l2.learning): the data plane reports a
// source a learning port sent that its network does not know (Learned);
// the agent records it in the endpoint's spec.learned (RecordLearned),
// lace-controller publishes it as a learned FDBEntry and Neighbor, and
// the node's sync hands back the learned MACs placed here
// (SetL2Learning), which SyncEntries puts at their ports. The agent never
// writes a Neighbor or FDBEntry itself: what another endpoint holds, or
// lace-controller assigned, is the controller's to judge.

// maxLearned is how many bindings an endpoint keeps (the API's bound):
// the oldest goes first.
const maxLearned = 16

// learnRound is how often recorded bindings are written: a burst of
// reports makes one update per endpoint.
const learnRound = 200 * time.Millisecond

// A port may add learnBurst new bindings at once, then one per
// learnRefill: a guest cycling through sources cannot make its endpoint,
// and lace-controller's work, churn faster.
const (
	learnBurst  = maxLearned
	learnRefill = 10 * time.Second
)

// maxSequence is the API's bound on a move sequence.
const maxSequence = 1 << 40

type learnState struct {
	mu       sync.Mutex
	learning map[uint32]bool
	learned  []model.L2Learned
	// pending are the reports not written yet, by endpoint (namespace/
	// name) and binding.
	pending map[types.NamespacedName][]lacev1.LearnedBinding
	// budget is each endpoint's allowance of new bindings (learnBurst,
	// learnRefill), used by RecordLearned only.
	budget map[types.NamespacedName]*learnBudget
	// activations are the activations recorded (migrate.go), while their
	// move holds.
	activations map[types.NamespacedName]lacev1.L2Activation
	// notTargets are the standby endpoints whose pod's target-ready
	// annotation is not the newest of its VM, by the entry's sequence
	// they were judged at (activateReadyTargets): judged once.
	notTargets map[types.NamespacedName]uint32
}

type learnBudget struct {
	tokens float64
	at     time.Time
}

// forgetFull drops the allowances that have refilled: an endpoint gone
// leaves nothing behind.
func (l *learnState) forgetFull(now time.Time) {
	for k, b := range l.budget {
		if now.Sub(b.at) >= learnBurst*learnRefill {
			delete(l.budget, k)
		}
	}
}

// take spends one new binding of key's allowance at now, if any is left.
func (l *learnState) take(key types.NamespacedName, now time.Time) bool {
	if l.budget == nil {
		l.budget = map[types.NamespacedName]*learnBudget{}
	}
	b := l.budget[key]
	if b == nil {
		b = &learnBudget{tokens: learnBurst, at: now}
		l.budget[key] = b
	}
	b.tokens = min(learnBurst, b.tokens+float64(now.Sub(b.at))/float64(learnRefill))
	b.at = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

func (l *learnState) learns(netID uint32) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.learning[netID]
}

// SetL2Learning implements nodesync.Pods.
func (s *Server) SetL2Learning(learning []uint32, learned []model.L2Learned) {
	l := &s.learn
	l.mu.Lock()
	defer l.mu.Unlock()
	l.learning = map[uint32]bool{}
	for _, id := range learning {
		l.learning[id] = true
	}
	l.learned = learned
}

// l2LocalEntries are this node's pods' l2 entries (l2Entries) with the
// learned MACs placed at their endpoints' ports.
func (s *Server) l2LocalEntries(eps []Endpoint) ([]datapath.L2Neighbor, []datapath.FDBEntry) {
	neigh, fdb := l2Entries(eps)
	s.learn.mu.Lock()
	learned := s.learn.learned
	s.learn.mu.Unlock()
	if len(learned) == 0 {
		return neigh, fdb
	}
	port := map[string]Endpoint{}
	for _, e := range eps {
		if e.Ready && !e.Deleting && e.L2 && e.HostIfIndex != 0 {
			port[e.PodNS+"/"+e.PodName] = e
		}
	}
	for _, l := range learned {
		if e, ok := port[l.Endpoint]; ok && e.NetID == l.NetID && s.learn.learns(l.NetID) {
			fdb = append(fdb, datapath.FDBEntry{NetID: l.NetID, MAC: l.MAC, IfIndex: uint32(e.HostIfIndex)})
		}
	}
	return neigh, fdb
}

// Learned takes a report of the data plane: a source port l.IfIndex sent.
// It is recorded for the port's endpoint when its network learns and the
// address (if any) is in the network's subnets; the rest is dropped
// (the program's rate limit bounds how often this runs).
func (s *Server) Learned(l datapath.L2Learned) {
	if l.Activated {
		s.activated(l)
		return
	}
	var ep *Endpoint
	for _, e := range s.cp.all() {
		if e.Ready && !e.Deleting && e.L2 && uint32(e.HostIfIndex) == l.IfIndex && e.NetID == l.NetID {
			ep = &e
			break
		}
	}
	if ep == nil || !s.learn.learns(l.NetID) {
		return
	}
	b := lacev1.LearnedBinding{MAC: lacev1.MACAddress(l.MAC.String())}
	if l.Addr.IsValid() {
		if p, ok := l2PrefixOf(ep, l.Addr); !ok || !ipam.L2Assignable(p, l.Addr) {
			l.Addr = netip.Addr{} // outside the subnet: the MAC alone
		} else {
			b.Address = lacev1.IPAddress(l.Addr.String())
		}
	}
	key := types.NamespacedName{Namespace: ep.PodNS, Name: ep.PodName}
	b.Sequence = s.claimSequence(ep.Network, key, l.MAC, l.Addr)
	s.learn.mu.Lock()
	defer s.learn.mu.Unlock()
	if s.learn.pending == nil {
		s.learn.pending = map[types.NamespacedName][]lacev1.LearnedBinding{}
	}
	s.learn.pending[key] = append(s.learn.pending[key], b)
}

// l2PrefixOf is the subnet of ep's network of a's family: the prefix of
// ep's address of that family.
func l2PrefixOf(ep *Endpoint, a netip.Addr) (netip.Prefix, bool) {
	for i, ad := range ep.Addrs {
		if ad.Is4() == a.Is4() && i < len(ep.PrefixBits) {
			p := netip.PrefixFrom(ad, ep.PrefixBits[i]).Masked()
			return p, p.Contains(a)
		}
	}
	return netip.Prefix{}, false
}

// claimSequence is the sequence this endpoint claims mac (and addr) with:
// one more than that of the endpoint holding it elsewhere (a move), else 0
// (RFC 7432 section 15).
func (s *Server) claimSequence(network string, ep types.NamespacedName, mac net.HardwareAddr, addr netip.Addr) int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var seq int64
	var f lacev1.FDBEntry
	if err := s.client.Get(ctx, client.ObjectKey{Name: ipam.FDBEntryName(network, mac)}, &f); err == nil &&
		(f.Annotations[lacev1.AnnotationEndpoint] != ep.String() || f.Spec.Node != s.opts.NodeName) {
		seq = min(f.Spec.Sequence+1, maxSequence)
	}
	if !addr.IsValid() {
		return seq
	}
	var n lacev1.Neighbor
	if err := s.client.Get(ctx, client.ObjectKey{Name: ipam.NeighborName(network, addr)}, &n); err == nil &&
		(n.Annotations[lacev1.AnnotationEndpoint] != ep.String() || string(n.Spec.MAC) != mac.String()) {
		seq = max(seq, min(n.Spec.Sequence+1, maxSequence))
	}
	return seq
}

// RecordLearned writes the recorded bindings to their endpoints' specs
// every learnRound until ctx ends, moves the MACs of migration targets
// KubeVirt marked ready, and catches up with activations no report said.
func (s *Server) RecordLearned(ctx context.Context) error {
	t := time.NewTicker(learnRound)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		s.activateReadyTargets(ctx)
		s.catchUpActivations()
		s.learn.mu.Lock()
		pending := s.learn.pending
		s.learn.pending = nil
		s.learn.forgetFull(time.Now())
		s.learn.mu.Unlock()
		for key, bs := range pending {
			if bs = s.withinBudget(key, bs); len(bs) == 0 {
				continue
			}
			if err := s.recordLearned(ctx, key, bs); err != nil {
				s.log.Warn("record learned l2 bindings", "endpoint", key.String(), "error", err)
			}
		}
	}
}

// withinBudget keeps the bindings of bs endpoint key may add now: one it
// recorded before (the same MAC and address) costs nothing.
func (s *Server) withinBudget(key types.NamespacedName, bs []lacev1.LearnedBinding) []lacev1.LearnedBinding {
	var have []lacev1.LearnedBinding
	var ne lacev1.NetworkEndpoint
	if err := s.client.Get(context.Background(), key, &ne); err == nil {
		have = ne.Spec.Learned
	}
	now := time.Now()
	s.learn.mu.Lock()
	defer s.learn.mu.Unlock()
	var out []lacev1.LearnedBinding
	for _, b := range bs {
		known := slices.ContainsFunc(append(have, out...), func(o lacev1.LearnedBinding) bool { return o.MAC == b.MAC && o.Address == b.Address })
		if known || s.learn.take(key, now) {
			out = append(out, b)
		}
	}
	return out
}

// recordLearned merges bs into the learned bindings of endpoint key.
func (s *Server) recordLearned(ctx context.Context, key types.NamespacedName, bs []lacev1.LearnedBinding) error {
	return s.updateOwnEndpoint(ctx, key, func(spec *lacev1.NetworkEndpointSpec) bool {
		merged := mergeLearned(spec.Learned, bs)
		if slices.Equal(merged, spec.Learned) {
			return false
		}
		spec.Learned = merged
		return true
	})
}

// updateOwnEndpoint applies change to the spec of endpoint key, when it is
// this node's and change says it changed it, retrying on conflicts. An
// update (the agent's role may not patch): it conflicts with any write
// since the read, as the resourceVersion is sent.
func (s *Server) updateOwnEndpoint(ctx context.Context, key types.NamespacedName, change func(*lacev1.NetworkEndpointSpec) bool) error {
	for range 5 {
		var ne lacev1.NetworkEndpoint
		if err := s.client.Get(ctx, key, &ne); err != nil {
			return client.IgnoreNotFound(err)
		}
		if ne.Spec.Node != s.opts.NodeName || ne.DeletionTimestamp != nil || !change(&ne.Spec) {
			return nil
		}
		err := s.client.Update(ctx, &ne)
		if !apierrors.IsConflict(err) {
			if err != nil {
				return fmt.Errorf("update NetworkEndpoint %s: %w", key, err)
			}
			return nil
		}
	}
	return fmt.Errorf("update NetworkEndpoint %s: conflicts", key)
}

// mergeLearned adds bs to have, newest last: a binding of the same MAC
// and address is replaced by one with a higher sequence (a claim again
// after a move away), an address takes the binding it had with another
// MAC; the oldest go beyond maxLearned.
func mergeLearned(have, bs []lacev1.LearnedBinding) []lacev1.LearnedBinding {
	out := slices.Clone(have)
	for _, b := range bs {
		i := slices.IndexFunc(out, func(o lacev1.LearnedBinding) bool {
			return o.MAC == b.MAC && o.Address == b.Address
		})
		if i >= 0 && out[i].Sequence >= b.Sequence {
			continue
		}
		out = slices.DeleteFunc(out, func(o lacev1.LearnedBinding) bool {
			return (o.MAC == b.MAC && o.Address == b.Address) || (b.Address != "" && o.Address == b.Address)
		})
		out = append(out, b)
	}
	if len(out) > maxLearned {
		out = out[len(out)-maxLearned:]
	}
	return out
}
