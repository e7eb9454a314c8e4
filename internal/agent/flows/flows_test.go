package flows

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"

	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/netpol"
)

type fakeDP struct {
	on   []bool
	fail int // how many switches fail first
}

func (f *fakeDP) SetFlows(on bool, _ uint32) error {
	if f.fail > 0 {
		f.fail--
		return fmt.Errorf("map write failed")
	}
	f.on = append(f.on, on)
	return nil
}
func (f *fakeDP) ReadFlows(ctx context.Context, _ func(datapath.FlowEvent)) error {
	<-ctx.Done()
	return nil
}
func (f *fakeDP) FlowsLost() (uint64, error) { return 0, nil }

// TestLogNamesAndBounds: asking turns events on; the log serves them
// after a sequence, oldest first, with the pod side of a policy's drop
// taken from its port, pods, networks and the policy named; it keeps the
// last logSize.
func TestLogNamesAndBounds(t *testing.T) {
	dp := &fakeDP{}
	names := Names{
		Pods: map[netpol.PeerKey]string{
			{NetID: 1, Addr: netip.MustParseAddr("10.0.0.2")}: "a/client",
			{NetID: 1, Addr: netip.MustParseAddr("10.0.0.3")}: "b/server",
		},
		Locals:   map[uint32]Local{7: {Pod: "b/server", NetID: 1}},
		Networks: map[uint32]string{1: "default"},
		Policies: map[uint32]netpol.PolicyRef{9: {Kind: "NetworkPolicy", Namespace: "b", Name: "in"}},
	}
	l := New("n1", dp, func(context.Context) (Names, error) { return names, nil }, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if fs, err := l.Since(context.Background(), 0, 0); err != nil || len(fs) != 0 || len(dp.on) != 1 || !dp.on[0] {
		t.Fatalf("first ask: %v %v, switch %v", fs, err, dp.on)
	}
	l.add(datapath.FlowEvent{Boot: time.Second, SrcNet: 1, IfIndex: 7, Policy: 9, Dropped: true, Reason: "policy", Ingress: true,
		PolicyDirDecided: true, Proto: 6, Src: netip.MustParseAddrPort("10.0.0.2:4000"), Dst: netip.MustParseAddrPort("10.0.0.3:80")})
	l.add(datapath.FlowEvent{Boot: 2 * time.Second, SrcNet: 1, DstNet: 1, IfIndex: 3, Proto: 17,
		Src: netip.MustParseAddrPort("10.0.0.2:4001"), Dst: netip.MustParseAddrPort("10.0.0.9:53")})
	fs, err := l.Since(context.Background(), 0, 0)
	if err != nil || len(fs) != 2 {
		t.Fatalf("flows %+v (%v)", fs, err)
	}
	d := fs[0]
	if d.Verdict != "dropped" || d.Reason != "policy" || d.Policy != "NetworkPolicy b/in" || d.Direction != "ingress" ||
		d.Src.Pod != "a/client" || d.Dst.Pod != "b/server" || d.Src.Network != "default" || d.Dst.Network != "default" || d.Proto != "tcp" {
		t.Errorf("the drop served as %+v", d)
	}
	if f := fs[1]; f.Verdict != "forwarded" || f.Dst.Pod != "" || f.Proto != "udp" || !f.Time.After(d.Time) {
		t.Errorf("the new flow served as %+v", f)
	}
	if fs, _ := l.Since(context.Background(), fs[0].Seq, 0); len(fs) != 1 || fs[0].Seq != 2 {
		t.Errorf("after seq 1: %+v", fs)
	}
	for range logSize + 10 {
		l.add(datapath.FlowEvent{Proto: 1})
	}
	fs, _ = l.Since(context.Background(), 0, 0)
	if len(fs) != logSize || fs[0].Seq != 13 || fs[len(fs)-1].Seq != logSize+12 {
		t.Errorf("kept %d, seq %d..%d; want the last %d", len(fs), fs[0].Seq, fs[len(fs)-1].Seq, logSize)
	}
	if len(dp.on) != 1 {
		t.Errorf("switched %v: asking again while on must not switch", dp.on)
	}
}

// TestLogNamesServices: a flow the data plane told with its frontend
// names the Service there (a node port on any node address); a packet
// dropped before translation names the Service its destination is; a
// forwarded flow without a frontend names none, whatever its address.
func TestLogNamesServices(t *testing.T) {
	vip := netip.MustParseAddrPort("10.96.0.10:53")
	names := Names{
		Services:  map[Frontend]string{{Proto: 17, Addr: vip.Addr(), Port: 53}: "kube-system/dns"},
		NodePorts: map[Frontend]string{{Proto: 6, Port: 30080}: "web/front"},
		NodeAddrs: map[netip.Addr]bool{netip.MustParseAddr("192.0.2.1"): true},
	}
	l := New("n1", &fakeDP{}, func(context.Context) (Names, error) { return names, nil }, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ep := netip.MustParseAddrPort("10.0.0.5:5353")
	node := netip.MustParseAddrPort("192.0.2.1:30080")
	l.add(datapath.FlowEvent{Proto: 17, Src: netip.MustParseAddrPort("10.0.0.2:4000"), Dst: ep, Service: vip})
	l.add(datapath.FlowEvent{Proto: 6, Src: netip.MustParseAddrPort("10.0.0.2:4001"), Dst: netip.MustParseAddrPort("10.0.0.6:8080"), Service: node})
	l.add(datapath.FlowEvent{Proto: 17, Dropped: true, Reason: "no-endpoints", Src: netip.MustParseAddrPort("10.0.0.2:4002"), Dst: vip})
	l.add(datapath.FlowEvent{Proto: 17, Src: netip.MustParseAddrPort("10.0.0.2:4003"), Dst: vip})
	l.add(datapath.FlowEvent{Proto: 6, Src: netip.MustParseAddrPort("10.0.0.2:4004"), Dst: vip, Service: vip}) // TCP: another port's protocol
	// A node port on an address that is no node's; a policy's drop to an
	// address a Service is at (not a frontend's refusal).
	l.add(datapath.FlowEvent{Proto: 6, Src: netip.MustParseAddrPort("10.0.0.2:4005"), Dst: ep, Service: netip.MustParseAddrPort("10.96.5.5:30080")})
	l.add(datapath.FlowEvent{Proto: 17, Dropped: true, Reason: "policy", PolicyDirDecided: true, Src: netip.MustParseAddrPort("10.0.0.2:4006"), Dst: vip})
	fs, err := l.Since(context.Background(), 0, 0)
	if err != nil || len(fs) != 7 {
		t.Fatalf("flows %+v (%v)", fs, err)
	}
	for i, want := range []struct {
		svc string
		at  netip.AddrPort
	}{{"kube-system/dns", vip}, {"web/front", node}, {"kube-system/dns", vip}, {}, {}, {}, {}} {
		f := fs[i]
		if f.Service != want.svc || (f.Frontend == nil) != (want.svc == "") || (f.Frontend != nil && *f.Frontend != want.at) {
			t.Errorf("flow %d: service %q at %v, want %q at %v", i, f.Service, f.Frontend, want.svc, want.at)
		}
	}
}

// TestLogNamesSender: a packet told at a pod's port names that pod as
// its sender (or receiver) whatever address it carries: a spoofed source
// never names the pod it forged.
func TestLogNamesSender(t *testing.T) {
	names := Names{
		Pods: map[netpol.PeerKey]string{
			{NetID: 1, Addr: netip.MustParseAddr("10.0.0.2")}: "a/forger",
			{NetID: 1, Addr: netip.MustParseAddr("10.0.0.3")}: "b/victim",
		},
		Locals: map[uint32]Local{7: {Pod: "a/forger", NetID: 1}, 8: {Pod: "c/dst", NetID: 1}},
	}
	l := New("n1", &fakeDP{}, func(context.Context) (Names, error) { return names, nil }, slog.New(slog.NewTextHandler(io.Discard, nil)))
	l.add(datapath.FlowEvent{SrcNet: 1, IfIndex: 7, Dropped: true, Reason: "spoofed-source", FromPort: true, Proto: 17,
		Src: netip.MustParseAddrPort("10.0.0.3:53"), Dst: netip.MustParseAddrPort("10.0.0.9:53")})
	l.add(datapath.FlowEvent{DstNet: 1, IfIndex: 8, Dropped: true, Reason: "header-adjust-failed", ToPort: true, Proto: 17,
		Src: netip.MustParseAddrPort("10.0.0.3:53"), Dst: netip.MustParseAddrPort("10.0.0.77:53")})
	fs, err := l.Since(context.Background(), 0, 0)
	if err != nil || len(fs) != 2 {
		t.Fatalf("flows %+v (%v)", fs, err)
	}
	if fs[0].Src.Pod != "a/forger" || fs[0].Src.Addr.Addr() != netip.MustParseAddr("10.0.0.3") {
		t.Errorf("a spoofed packet served as sent by %q from %v, want a/forger with the forged address", fs[0].Src.Pod, fs[0].Src.Addr)
	}
	if fs[1].Dst.Pod != "c/dst" {
		t.Errorf("a packet for the pod at port 8 served as for %q", fs[1].Dst.Pod)
	}
}

// TestHandlerRefusesPods: /flows answers a node address and refuses an
// address a pod holds, without turning the events on.
func TestHandlerRefusesPods(t *testing.T) {
	dp := &fakeDP{}
	names := Names{Pods: map[netpol.PeerKey]string{{NetID: 3, Addr: netip.MustParseAddr("fd00:61::5")}: "t/spy"}}
	l := New("n1", dp, func(context.Context) (Names, error) { return names, nil }, slog.New(slog.NewTextHandler(io.Discard, nil)))
	for _, c := range []struct {
		from string
		want int
	}{{"[fd00:61::5]:40000", http.StatusForbidden}, {"[::ffff:10.0.0.1]:40000", http.StatusOK}, {"172.30.0.2:5000", http.StatusOK}} {
		r := httptest.NewRequest(http.MethodGet, "/flows", nil)
		r.RemoteAddr = c.from
		w := httptest.NewRecorder()
		l.Handler().ServeHTTP(w, r)
		if w.Code != c.want {
			t.Errorf("from %s: %d, want %d", c.from, w.Code, c.want)
		}
	}
	if len(dp.on) != 1 {
		t.Errorf("switched %v: the refused request must not turn events on", dp.on)
	}
}

// TestSwitchRetried: an ask whose switch failed is an error, and the next
// ask turns the events on.
func TestSwitchRetried(t *testing.T) {
	dp := &fakeDP{fail: 1}
	l := New("n1", dp, func(context.Context) (Names, error) { return Names{}, nil }, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if _, err := l.Since(context.Background(), 0, 0); err == nil {
		t.Fatal("a failed switch: no error")
	}
	if _, err := l.Since(context.Background(), 0, 0); err != nil || len(dp.on) != 1 || !dp.on[0] {
		t.Errorf("the next ask: %v, switched %v; want the events turned on", err, dp.on)
	}
}
