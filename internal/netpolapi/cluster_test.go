package netpolapi

import (
	"net/netip"
	"reflect"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/lace-cni/lace/internal/netpol"
)

func cnp(t *testing.T, doc string) *unstructured.Unstructured {
	t.Helper()
	var m map[string]any
	if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
		t.Fatal(err)
	}
	return &unstructured.Unstructured{Object: m}
}

// TestClusterPolicyOf: the v1beta1 wire form read into netpol's terms; what
// cannot be read stays as something the compiler fails closed on.
func TestClusterPolicyOf(t *testing.T) {
	p, err := ClusterPolicyOf(cnp(t, `
metadata: {name: p}
spec:
  tier: Admin
  priority: 7
  subject: {namespaces: {matchLabels: {team: a}}}
  ingress:
  - name: r0
    action: Pass
    from: [{pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: x}}}}]
    protocols: [{tcp: {destinationPort: {number: 80}}}, {udp: {destinationPort: {range: {start: 1000, end: 2000}}}}, {destinationNamedPort: http}]
  egress:
  - action: Deny
    to: [{networks: ["10.0.0.0/8", "fd00::/8"]}, {domainNames: ["example.com"]}, {networks: ["bogus"]}]
    protocols: [{}, {sctp: {destinationPort: {number: 70000}}}]
  - action: Bogus
    to: [{nodes: {}}]
`))
	if err != nil {
		t.Fatal(err)
	}
	if p.Name != "p" || p.Tier != netpol.TierAdmin || p.Priority != 7 || p.Subject.Namespaces == nil || p.Subject.Pods != nil {
		t.Errorf("policy %+v", p)
	}
	in := p.Ingress[0]
	if in.Name != "r0" || in.Action != netpol.ActionPass || len(in.Peers) != 1 || in.Peers[0].Pods == nil {
		t.Errorf("ingress rule %+v", in)
	}
	wantProto := []netpol.ClusterProtocol{{Protocol: "TCP", Port: 80}, {Protocol: "UDP", Port: 1000, End: 2000}, {NamedPort: "http"}}
	if !reflect.DeepEqual(in.Protocols, wantProto) {
		t.Errorf("protocols %+v, want %+v", in.Protocols, wantProto)
	}
	eg := p.Egress[0]
	if eg.Action != netpol.ActionDeny || len(eg.Peers) != 3 {
		t.Fatalf("egress rule %+v", eg)
	}
	if want := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}; !reflect.DeepEqual(eg.Peers[0].Networks, want) {
		t.Errorf("networks %v", eg.Peers[0].Networks)
	}
	// domainNames only and an unreadable network: unrecognised peers.
	for i, peer := range eg.Peers[1:] {
		if !reflect.DeepEqual(peer, netpol.ClusterPeer{}) {
			t.Errorf("peer %d: %+v, want an unrecognised (empty) peer", i+1, peer)
		}
	}
	// An entry of no protocol, a port out of range: invalid entries.
	if want := []netpol.ClusterProtocol{{}, {Protocol: "SCTP"}}; !reflect.DeepEqual(eg.Protocols, want) {
		t.Errorf("protocols %+v, want %+v", eg.Protocols, want)
	}
	if p.Egress[1].Action != netpol.ActionDeny || p.Egress[1].Peers[0].Nodes == nil {
		t.Errorf("an unknown action must read as Deny: %+v", p.Egress[1])
	}
	if _, err := ClusterPolicyOf(cnp(t, `{metadata: {name: q}, spec: {tier: Middle}}`)); err == nil {
		t.Error("an unknown tier was read")
	}
}
