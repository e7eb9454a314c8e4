// Package flows keeps the node's recent flow events for `lacectl flows`:
// it turns the data plane's flow events on while someone asks for them
// (bpf/include/flows.h: off, they cost one array lookup), reads the ring
// into a bounded log, serves it on the metrics server (/flows) with pods,
// networks and policies named, and counts the events by verdict.
//
// It owns the flow ring and its switch, nothing else of the data plane.
package flows

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/netpol"
)

// DataPlane is what the log needs of the data plane.
type DataPlane interface {
	SetFlows(on bool, perSec uint32) error
	ReadFlows(ctx context.Context, f func(datapath.FlowEvent)) error
	FlowsLost() (uint64, error)
}

// Local is a pod of this node at a port.
type Local struct {
	Pod   string // namespace/name
	NetID uint32
}

// Names turns a flow's numbers into names: pods by network and address,
// the node's pods by port, networks and policies by ID, Services by
// frontend.
type Names struct {
	Pods     map[netpol.PeerKey]string
	Locals   map[uint32]Local
	Networks map[uint32]string
	Policies map[uint32]netpol.PolicyRef
	// Services are namespace/name by the frontends they serve on: a
	// ClusterIP, external or load balancer address, and port.
	Services map[Frontend]string
	// NodePorts are namespace/name by node port, on any of NodeAddrs.
	NodePorts map[Frontend]string
	NodeAddrs map[netip.Addr]bool
}

// Frontend is where a Service is addressed: Addr is invalid for a node
// port.
type Frontend struct {
	Proto uint8
	Addr  netip.Addr
	Port  uint16
}

// Namer reads the names as they are now.
type Namer func(ctx context.Context) (Names, error)

const (
	// logSize is how many events the log keeps.
	logSize = 4096
	// perSec is each CPU's budget of events a second.
	perSec = 2000
	// idle is how long the events stay on after the last request.
	idle = time.Minute
)

// Log is the node's flow log.
type Log struct {
	node string
	dp   DataPlane
	name Namer
	log  *slog.Logger
	// boot is the wall clock time of the monotonic clock's zero.
	boot time.Time

	mu     sync.Mutex
	ring   []entry
	seq    uint64
	asked  time.Time
	on     bool
	counts *prometheus.CounterVec
}

type entry struct {
	seq uint64
	ev  datapath.FlowEvent
}

// New makes the node's log; Run reads the ring, Handler serves it.
func New(node string, dp DataPlane, name Namer, log *slog.Logger) *Log {
	var mono unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &mono)
	return &Log{node: node, dp: dp, name: name, log: log.With("part", "flows"),
		boot: time.Now().Add(-time.Duration(mono.Nano())),
		counts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lace_flow_events_total",
			Help: "Flow events the data plane told while someone watched flows (lacectl flows): new flows forwarded and packets refused, by verdict and drop reason.",
		}, []string{"verdict", "reason"})}
}

// Collectors are the log's metrics.
func (l *Log) Collectors() []prometheus.Collector {
	lost := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "lace_flow_events_lost_total",
		Help: "Flow events the data plane did not tell: over each CPU's budget, or the ring full.",
	}, func() float64 {
		n, err := l.dp.FlowsLost()
		if err != nil {
			return 0
		}
		return float64(n)
	})
	return []prometheus.Collector{l.counts, lost}
}

// Run reads the ring until ctx ends, and turns the events off when
// nobody asked for a minute.
func (l *Log) Run(ctx context.Context) error {
	// Nobody asks at start: a restart leaves them off.
	if err := l.dp.SetFlows(false, perSec); err != nil {
		l.log.Info("turn flow events off", "err", err)
	}
	go func() {
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				// The switch is written under the lock that records it:
				// an idle tick's "off" never lands after an ask's "on".
				l.mu.Lock()
				if l.on && time.Since(l.asked) > idle {
					l.on = false
					if err := l.dp.SetFlows(false, perSec); err != nil {
						l.log.Info("turn flow events off", "err", err)
					}
				}
				l.mu.Unlock()
			}
		}
	}()
	return l.dp.ReadFlows(ctx, l.add)
}

func (l *Log) add(ev datapath.FlowEvent) {
	verdict := "forwarded"
	if ev.Dropped {
		verdict = "dropped"
	}
	l.counts.WithLabelValues(verdict, ev.Reason).Inc()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seq++
	e := entry{seq: l.seq, ev: ev}
	if len(l.ring) < logSize {
		l.ring = append(l.ring, e)
	} else {
		l.ring[(l.seq-1)%logSize] = e // the oldest
	}
}

// Flow is one event as /flows serves it.
type Flow struct {
	Seq       uint64    `json:"seq"`
	Time      time.Time `json:"time"`
	Node      string    `json:"node"`
	Verdict   string    `json:"verdict"`
	Reason    string    `json:"reason,omitempty"`
	Policy    string    `json:"policy,omitempty"`
	Direction string    `json:"direction,omitempty"`
	Proto     string    `json:"proto"`
	TCPFlags  uint8     `json:"tcpFlags,omitempty"`
	// Service is the Service the source addressed (namespace/name), and
	// Frontend where: Dst is then the endpoint it was translated to, or
	// the frontend itself when the packet was dropped before that.
	Service  string          `json:"service,omitempty"`
	Frontend *netip.AddrPort `json:"frontend,omitempty"`
	Src      Endpoint        `json:"src"`
	Dst      Endpoint        `json:"dst"`
}

// Endpoint is one side of a flow.
type Endpoint struct {
	Addr    netip.AddrPort `json:"addr"`
	Pod     string         `json:"pod,omitempty"`
	Network string         `json:"network,omitempty"`
}

// Since returns the events after seq, oldest first (at most limit), and
// turns the events on: someone is asking.
func (l *Log) Since(ctx context.Context, seq uint64, limit int) ([]Flow, error) {
	l.mu.Lock()
	l.asked = time.Now()
	if !l.on {
		// Recorded on only once the data plane is: a failed switch is
		// tried again by the next ask.
		if err := l.dp.SetFlows(true, perSec); err != nil {
			l.mu.Unlock()
			return nil, err
		}
		l.on = true
	}
	var es []entry
	for _, e := range l.ring {
		if e.seq > seq {
			es = append(es, e)
		}
	}
	l.mu.Unlock()
	sort.Slice(es, func(i, j int) bool { return es[i].seq < es[j].seq })
	if limit > 0 && len(es) > limit {
		es = es[len(es)-limit:]
	}
	names, err := l.name(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]Flow, 0, len(es))
	for _, e := range es {
		out = append(out, l.flow(e, names))
	}
	return out, nil
}

func (l *Log) flow(e entry, n Names) Flow {
	ev := e.ev
	f := Flow{Seq: e.seq, Time: l.boot.Add(ev.Boot), Node: l.node, Verdict: "forwarded", Proto: protoName(ev.Proto),
		TCPFlags: ev.TCPFlags, Src: Endpoint{Addr: ev.Src}, Dst: Endpoint{Addr: ev.Dst}}
	if ev.Dropped {
		f.Verdict, f.Reason = "dropped", ev.Reason
	}
	if ev.PolicyDirDecided {
		f.Direction = "egress"
		if ev.Ingress {
			f.Direction = "ingress"
		}
	}
	if ref, ok := n.Policies[ev.Policy]; ok && ev.Policy != 0 {
		f.Policy = ref.String()
	}
	// The side at the port is the node's pod: its network is its own, and
	// it is named by its port, not by the address the packet carries (a
	// spoofed source names the pod that sent it, never the one it
	// forged).
	src, dst := ev.SrcNet, ev.DstNet
	loc, atPort := n.Locals[ev.IfIndex]
	if atPort {
		if src == 0 {
			src = loc.NetID
		}
		if dst == 0 {
			dst = loc.NetID
		}
	}
	f.Src.Network, f.Dst.Network = n.Networks[src], n.Networks[dst]
	f.Src.Pod = n.Pods[netpol.PeerKey{NetID: src, Addr: ev.Src.Addr()}]
	f.Dst.Pod = n.Pods[netpol.PeerKey{NetID: dst, Addr: ev.Dst.Addr()}]
	if atPort && ev.FromPort {
		f.Src.Pod = loc.Pod
	}
	if atPort && ev.ToPort {
		f.Dst.Pod = loc.Pod
	}
	f.Service, f.Frontend = n.service(ev)
	return f
}

// frontendReasons are the drops of a packet still addressed to a
// Service's frontend (refused before translation): only these name the
// Service by their destination.
var frontendReasons = map[string]bool{"no-endpoints": true, "no-service-port": true, "no-local-endpoints": true,
	"source-range": true, "frontend-closed": true}

// service names the Service a flow addressed: the frontend the data plane
// told (the flow was translated), or else the destination of a packet a
// frontend refused (before translation: a Service without endpoints).
func (n Names) service(ev datapath.FlowEvent) (string, *netip.AddrPort) {
	at := ev.Service
	if !at.IsValid() {
		if !ev.Dropped || !frontendReasons[ev.Reason] {
			return "", nil
		}
		at = ev.Dst
	}
	fe := Frontend{Proto: ev.Proto, Addr: at.Addr().Unmap(), Port: at.Port()}
	name, ok := n.Services[fe]
	if !ok && n.NodeAddrs[fe.Addr] {
		fe.Addr = netip.Addr{}
		name, ok = n.NodePorts[fe]
	}
	if !ok {
		return "", nil
	}
	return name, &at
}

func protoName(p uint8) string {
	switch p {
	case unix.IPPROTO_TCP:
		return "tcp"
	case unix.IPPROTO_UDP:
		return "udp"
	case unix.IPPROTO_SCTP:
		return "sctp"
	case unix.IPPROTO_ICMP:
		return "icmp"
	case unix.IPPROTO_ICMPV6:
		return "icmpv6"
	}
	return strconv.Itoa(int(p))
}

// Handler serves GET /flows?since=SEQ&limit=N as a JSON array. Never to
// a pod: a request from an address a pod holds (in any network; a pod
// cannot send from another's, the data plane drops spoofed sources) is
// refused, so a tenant whose view reaches the node's address cannot read
// the node's flows. The API server's pod proxy, the node's own processes
// and hostNetwork pods speak from node addresses.
func (l *Log) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if forbid, err := l.fromPod(r); err != nil || forbid {
			if err == nil {
				err = fmt.Errorf("not served to pods")
			}
			http.Error(w, fmt.Sprintf("flows: %v", err), http.StatusForbidden)
			return
		}
		since, _ := strconv.ParseUint(r.URL.Query().Get("since"), 10, 64)
		limit, _ := strconv.Atoi(r.URL.Query().Get("limit"))
		fs, err := l.Since(r.Context(), since, limit)
		if err != nil {
			http.Error(w, fmt.Sprintf("flows: %v", err), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(fs)
	})
}

// fromPod tells whether r comes from an address some pod holds.
func (l *Log) fromPod(r *http.Request) (bool, error) {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return false, fmt.Errorf("remote address %q: %w", r.RemoteAddr, err)
	}
	names, err := l.name(r.Context())
	if err != nil {
		return false, err
	}
	from := ap.Addr().Unmap()
	for k := range names.Pods {
		if k.Addr == from {
			return true, nil
		}
	}
	return false, nil
}
