package flows

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/netpol"
)

type fakeDP struct{ on []bool }

func (f *fakeDP) SetFlows(on bool, _ uint32) error { f.on = append(f.on, on); return nil }
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
	}
	l := New("n1", &fakeDP{}, func(context.Context) (Names, error) { return names, nil }, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ep := netip.MustParseAddrPort("10.0.0.5:5353")
	node := netip.MustParseAddrPort("192.0.2.1:30080")
	l.add(datapath.FlowEvent{Proto: 17, Src: netip.MustParseAddrPort("10.0.0.2:4000"), Dst: ep, Service: vip})
	l.add(datapath.FlowEvent{Proto: 6, Src: netip.MustParseAddrPort("10.0.0.2:4001"), Dst: netip.MustParseAddrPort("10.0.0.6:8080"), Service: node})
	l.add(datapath.FlowEvent{Proto: 17, Dropped: true, Reason: "no-endpoints", Src: netip.MustParseAddrPort("10.0.0.2:4002"), Dst: vip})
	l.add(datapath.FlowEvent{Proto: 17, Src: netip.MustParseAddrPort("10.0.0.2:4003"), Dst: vip})
	l.add(datapath.FlowEvent{Proto: 6, Src: netip.MustParseAddrPort("10.0.0.2:4004"), Dst: vip, Service: vip}) // TCP: another port's protocol
	fs, err := l.Since(context.Background(), 0, 0)
	if err != nil || len(fs) != 5 {
		t.Fatalf("flows %+v (%v)", fs, err)
	}
	for i, want := range []struct {
		svc string
		at  netip.AddrPort
	}{{"kube-system/dns", vip}, {"web/front", node}, {"kube-system/dns", vip}, {}, {}} {
		f := fs[i]
		if f.Service != want.svc || (f.Frontend == nil) != (want.svc == "") || (f.Frontend != nil && *f.Frontend != want.at) {
			t.Errorf("flow %d: service %q at %v, want %q at %v", i, f.Service, f.Frontend, want.svc, want.at)
		}
	}
}
