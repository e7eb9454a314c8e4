package lacectl

import (
	"bytes"
	"context"
	"encoding/xml"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/pkg/scheme"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// The label the chart puts on every network (deploy/helm/lace/values.yaml).
const netLabel = "lace-cni.io/network"

func tnet(name string, id int32, typ lacev1.NetworkType, labels map[string]string, prefixes ...string) *lacev1.Network {
	n := &lacev1.Network{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{netLabel: name}},
		Spec: lacev1.NetworkSpec{Type: typ}, Status: lacev1.NetworkStatus{ID: id}}
	for k, v := range labels {
		n.Labels[k] = v
	}
	for _, p := range prefixes {
		switch {
		case typ == lacev1.NetworkTypeExternal:
			n.Spec.ExternalPrefixes = append(n.Spec.ExternalPrefixes, lacev1.CIDR(p))
		case strings.Contains(p, ":"):
			n.Spec.IPv6Subnet = &lacev1.Subnet{Prefix: lacev1.CIDR(p)}
		default:
			n.Spec.IPv4Subnet = &lacev1.Subnet{Prefix: lacev1.CIDR(p)}
		}
	}
	return n
}

func tnrp(name string, src, dst map[string]string) *lacev1.NetworkRoutingPolicy {
	return &lacev1.NetworkRoutingPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: lacev1.NetworkRoutingPolicySpec{
		SrcSelector:  &metav1.LabelSelector{MatchLabels: src},
		DestSelector: &metav1.LabelSelector{MatchLabels: dst},
	}}
}

// demoObjects: the chart's defaults (default <-> world), frontend -> backend
// one way (docs/topology.md's first example), shared meshed with frontend both ways
// by one policy on a label (its second example), an anonymous
// network left closed, an anonymous network opened to itself, a legacy
// network that the frontend policy also selects but whose subnet overlaps
// frontend's (refused), and a network not yet given an ID.
func demoObjects() []client.Object {
	secret := tnet("secret", 6, lacev1.NetworkTypeL3, nil, "10.40.0.0/16")
	secret.Spec.Anonymous = true
	sandbox := tnet("sandbox", 7, lacev1.NetworkTypeL3, map[string]string{"sandbox": "open"}, "10.50.0.0/16")
	sandbox.Spec.Anonymous = true
	return []client.Object{
		tnet("default", 1, lacev1.NetworkTypeL3, nil, "10.244.0.0/16", "fd00:244::/56"),
		tnet("world", 2, lacev1.NetworkTypeExternal, nil, "0.0.0.0/0", "::/0"),
		tnet("frontend", 3, lacev1.NetworkTypeL3, map[string]string{"tier": "frontend", "vrf": "prod"}, "10.10.0.0/16"),
		tnet("backend", 4, lacev1.NetworkTypeL3, map[string]string{"tier": "backend"}, "10.20.0.0/16"),
		tnet("shared", 5, lacev1.NetworkTypeL3, map[string]string{"vrf": "prod"}, "10.30.0.0/16"),
		secret,
		sandbox,
		tnet("legacy", 8, lacev1.NetworkTypeL3, map[string]string{"tier": "backend"}, "10.10.0.0/16"),
		tnet("staging", 0, lacev1.NetworkTypeL3, nil, "10.60.0.0/16"),
		tnrp("default-to-world", map[string]string{netLabel: "default"}, map[string]string{netLabel: "world"}),
		tnrp("world-to-default", map[string]string{netLabel: "world"}, map[string]string{netLabel: "default"}),
		tnrp("frontend-to-backend", map[string]string{"tier": "frontend"}, map[string]string{"tier": "backend"}),
		tnrp("prod-mesh", map[string]string{"vrf": "prod"}, map[string]string{"vrf": "prod"}),
		tnrp("sandbox-self", map[string]string{"sandbox": "open"}, map[string]string{"sandbox": "open"}),
		&lacev1.ServiceRoutingPolicy{ObjectMeta: metav1.ObjectMeta{Name: "frontend-to-payments"}},
	}
}

func runTopology(t *testing.T, withSVG bool) (text, svg []byte) {
	t.Helper()
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(demoObjects()...).Build()
	var out, s bytes.Buffer
	var sw io.Writer
	if withSVG {
		sw = &s
	}
	if err := Topology(context.Background(), c, &out, sw); err != nil {
		t.Fatal(err)
	}
	return out.Bytes(), s.Bytes()
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./internal/lacectl/ -run %s -update to create it)", err, t.Name())
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the golden file (go test ./internal/lacectl/ -run %s -update rewrites it); got:\n%s", path, t.Name(), got)
	}
}

// TestTopologyText: the networks table and every source's reach, from the
// oracle, against the golden file; and the rows an operator looks for.
func TestTopologyText(t *testing.T) {
	text, svg := runTopology(t, false)
	if len(svg) != 0 {
		t.Errorf("no --svg, yet %d bytes of drawing", len(svg))
	}
	golden(t, "topology.txt", text)
	for _, re := range [][]string{
		{"frontend", "backend", "10.20.0.0/16", "NetworkRoutingPolicy frontend-to-backend"},
		{"frontend", "shared", "10.30.0.0/16", "NetworkRoutingPolicy prod-mesh"},
		{"shared", "frontend", "10.10.0.0/16", "NetworkRoutingPolicy prod-mesh"},
		{"default", "world", "0.0.0.0/0", "NetworkRoutingPolicy default-to-world"},
		{"world", "default", "fd00:244::/56", "NetworkRoutingPolicy world-to-default"},
		{"default", "default", "10.244.0.0/16", "own network"},
		{"secret", "secret", "10.40.0.0/16", "CLOSED"},
		{"sandbox", "sandbox", "10.50.0.0/16", "NetworkRoutingPolicy sandbox-self"},
		{"frontend", "legacy", "10.10.0.0/16", "REFUSED: NetworkRoutingPolicy frontend-to-backend, overlaps frontend 10.10.0.0/16"},
		{"staging", "-", "-", "no ID yet"},
	} {
		if !hasRow(string(text), re) {
			t.Errorf("no row %q in\n%s", re, text)
		}
	}
	// Directional: backend may not reach frontend.
	if hasRow(string(text), []string{"backend", "frontend"}) {
		t.Errorf("backend reaches frontend without a policy:\n%s", text)
	}
}

// hasRow: a line whose fields start with want, in order (the last field
// may span several words).
func hasRow(text string, want []string) bool {
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) < len(want) {
			continue
		}
		ok := true
		for i, w := range want {
			if i == len(want)-1 {
				ok = ok && strings.HasPrefix(strings.Join(f[i:], " "), w)
			} else {
				ok = ok && f[i] == w
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// TestTopologySVG: the drawing against the golden file, twice the same
// bytes, well-formed XML, one box per network and one arrow per peering,
// the refused one red and dashed.
func TestTopologySVG(t *testing.T) {
	_, svg := runTopology(t, true)
	golden(t, "topology.svg", svg)
	if _, again := runTopology(t, true); !bytes.Equal(svg, again) {
		t.Error("two drawings of the same topology differ")
	}

	type edge struct{ from, to, policy, class, stroke, dash string }
	var edges []edge
	boxes := map[string]bool{}
	d := xml.NewDecoder(bytes.NewReader(svg))
	root := ""
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v", err)
		}
		se, ok := tok.(xml.StartElement)
		if !ok {
			continue
		}
		if root == "" {
			root = se.Name.Local
		}
		attr := map[string]string{}
		for _, a := range se.Attr {
			attr[a.Name.Local] = a.Value
		}
		switch {
		case se.Name.Local == "g" && attr["class"] == "network":
			boxes[attr["data-network"]] = true
		case se.Name.Local == "path" && strings.HasPrefix(attr["class"], "peering"):
			edges = append(edges, edge{attr["data-from"], attr["data-to"], attr["data-policy"], attr["class"], attr["stroke"], attr["stroke-dasharray"]})
		}
	}
	if root != "svg" {
		t.Errorf("root element %q, want svg", root)
	}
	for _, n := range []string{"default", "world", "frontend", "backend", "shared", "secret", "sandbox", "legacy", "staging"} {
		if !boxes[n] {
			t.Errorf("no box for network %s", n)
		}
	}
	want := map[edge]bool{
		{"default", "world", "default-to-world", "peering", colorEdge, ""}:                    true,
		{"world", "default", "world-to-default", "peering", colorEdge, ""}:                    true,
		{"frontend", "backend", "frontend-to-backend", "peering", colorEdge, ""}:              true,
		{"frontend", "shared", "prod-mesh", "peering", colorEdge, ""}:                         true,
		{"shared", "frontend", "prod-mesh", "peering", colorEdge, ""}:                         true,
		{"frontend", "legacy", "frontend-to-backend", "peering refused", colorRefused, "7,4"}: true,
	}
	for _, e := range edges {
		if !want[e] {
			t.Errorf("unexpected edge %+v", e)
		}
		delete(want, e)
	}
	for e := range want {
		t.Errorf("missing edge %+v", e)
	}
}
