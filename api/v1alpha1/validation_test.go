package v1alpha1_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/lace-cni/lace/lab/controlplane/cptest"
)

func decode(t *testing.T, doc string) *unstructured.Unstructured {
	t.Helper()
	obj := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(doc), &obj.Object); err != nil {
		t.Fatalf("parse %q: %v", doc, err)
	}
	return obj
}

// TestSpecExamples applies the product examples (docs/networks.md,
// docs/topology.md; a nameless one gets its file's name) to a real
// kube-apiserver, so the CRDs' CEL rules accept them. TestDocExamples checks
// every example of docs/*.md against the Go types.
func TestSpecExamples(t *testing.T) {
	env := cptest.Start(t)
	ctx := context.Background()
	files, err := filepath.Glob("testdata/spec-examples/*.yaml")
	if err != nil || len(files) < 6 {
		t.Fatalf("want the 6 spec examples, found %d (%v)", len(files), err)
	}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		obj := decode(t, string(raw))
		if obj.GetName() == "" {
			obj.SetName(strings.TrimSuffix(filepath.Base(f), ".yaml"))
		}
		if err := env.Client.Create(ctx, obj); err != nil {
			t.Errorf("%s: rejected: %v", f, err)
		}
	}
}

type invalidCase struct {
	name string
	// base, when set, is created first; doc is then applied as an update.
	base string
	doc  string
	// want are substrings the rejection must contain: the field's path and
	// the gist of the message.
	want []string
}

const netL3 = `
apiVersion: lace-cni.io/v1alpha1
kind: Network
metadata: {name: %s}
spec:
  type: l3
  ipv4Subnet: {prefix: 10.40.0.0/16, hostLocalPrefixLength: 24}
`

func invalidCases() []invalidCase {
	net := func(name, spec string) string {
		return fmt.Sprintf("apiVersion: lace-cni.io/v1alpha1\nkind: Network\nmetadata: {name: %s}\nspec:\n%s", name, spec)
	}
	kind := func(k, name, spec string) string {
		return fmt.Sprintf("apiVersion: lace-cni.io/v1alpha1\nkind: %s\nmetadata: {name: %s}\nspec:\n%s", k, name, spec)
	}
	nsKind := func(k, name, spec string) string {
		return fmt.Sprintf("apiVersion: lace-cni.io/v1alpha1\nkind: %s\nmetadata: {name: %s, namespace: default}\nspec:\n%s", k, name, spec)
	}
	return []invalidCase{
		{name: "l3 without subnet", doc: net("n1", "  type: l3\n"),
			want: []string{"spec", "an l3 network needs spec.ipv4Subnet or spec.ipv6Subnet"}},
		{name: "l2 without subnet", doc: net("n2", "  type: l2\n"),
			want: []string{"an l2 network needs spec.ipv4Subnet or spec.ipv6Subnet"}},
		{name: "l3 without hostLocalPrefixLength", doc: net("n3", "  type: l3\n  ipv4Subnet: {prefix: 10.1.0.0/16}\n"),
			want: []string{"spec.ipv4Subnet", "hostLocalPrefixLength is required"}},
		{name: "l3 v6 without hostLocalPrefixLength", doc: net("n3b", "  type: l3\n  ipv6Subnet: {prefix: 'fd00:1::/48'}\n"),
			want: []string{"spec.ipv6Subnet", "hostLocalPrefixLength is required"}},
		{name: "anonymous l2", doc: net("n2a", "  type: l2\n  anonymous: true\n  ipv4Subnet: {prefix: 10.1.0.0/24}\n"),
			want: []string{"spec.anonymous", "only for l3 networks"}},
		{name: "l2 with hostLocalPrefixLength", doc: net("n4", "  type: l2\n  ipv4Subnet: {prefix: 10.1.0.0/24, hostLocalPrefixLength: 26}\n"),
			want: []string{"spec.ipv4Subnet.hostLocalPrefixLength", "only for l3"}},
		{name: "external without prefixes", doc: net("n5", "  type: external\n"),
			want: []string{"spec.externalPrefixes"}},
		{name: "external with subnet", doc: net("n6", "  type: external\n  externalPrefixes: [192.0.2.0/24]\n  ipv4Subnet: {prefix: 10.1.0.0/24}\n"),
			want: []string{"external network has no spec.ipv4Subnet"}},
		{name: "l3 with externalPrefixes", doc: net("n7", "  type: l3\n  ipv4Subnet: {prefix: 10.1.0.0/16, hostLocalPrefixLength: 24}\n  externalPrefixes: [192.0.2.0/24]\n"),
			want: []string{"spec.externalPrefixes", "only for external networks"}},
		{name: "prefix length out of range", doc: net("n8", "  type: l3\n  ipv4Subnet: {prefix: 10.1.0.0/33, hostLocalPrefixLength: 24}\n"),
			want: []string{"spec.ipv4Subnet.prefix", "must be a CIDR"}},
		{name: "prefix with host bits", doc: net("n9", "  type: l2\n  ipv4Subnet: {prefix: 10.1.0.1/16}\n"),
			want: []string{"spec.ipv4Subnet.prefix", "no host bits"}},
		{name: "IPv6 prefix as ipv4Subnet", doc: net("n10", "  type: l2\n  ipv4Subnet: {prefix: 'fd00::/64'}\n"),
			want: []string{"spec.ipv4Subnet.prefix", "must be an IPv4 prefix"}},
		{name: "IPv4 prefix as ipv6Subnet", doc: net("n10b", "  type: l2\n  ipv6Subnet: {prefix: 10.0.0.0/8}\n"),
			want: []string{"spec.ipv6Subnet.prefix", "must be an IPv6 prefix"}},
		{name: "block larger than subnet", doc: net("n11", "  type: l3\n  ipv4Subnet: {prefix: 10.1.0.0/16, hostLocalPrefixLength: 8}\n"),
			want: []string{"spec.ipv4Subnet.hostLocalPrefixLength", "between the prefix length and 30"}},
		{name: "block too small for a pod", doc: net("n12", "  type: l3\n  ipv4Subnet: {prefix: 10.1.0.0/16, hostLocalPrefixLength: 32}\n"),
			want: []string{"spec.ipv4Subnet.hostLocalPrefixLength", "between the prefix length and 30"}},
		{name: "v6 block too small", doc: net("n13", "  type: l3\n  ipv6Subnet: {prefix: 'fd00:1::/48', hostLocalPrefixLength: 128}\n"),
			want: []string{"spec.ipv6Subnet.hostLocalPrefixLength", "between the prefix length and 126"}},
		{name: "unknown type", doc: net("n14", "  type: l4\n"),
			want: []string{"spec.type", "Unsupported value"}},
		{name: "external prefix not a CIDR", doc: net("n15", "  type: external\n  externalPrefixes: [corp-lan]\n"),
			want: []string{"spec.externalPrefixes[0]", "must be a CIDR"}},
		{name: "network name with a dot", doc: net("a.b", "  type: l2\n  ipv4Subnet: {prefix: 10.1.0.0/24}\n"),
			want: []string{"metadata.name", "DNS label"}},
		{name: "type changed", base: fmt.Sprintf(netL3, "u1"),
			doc:  net("u1", "  type: l2\n  ipv4Subnet: {prefix: 10.40.0.0/16}\n"),
			want: []string{"spec.type", "immutable"}},
		{name: "subnet changed", base: fmt.Sprintf(netL3, "u2"),
			doc:  net("u2", "  type: l3\n  ipv4Subnet: {prefix: 10.41.0.0/16, hostLocalPrefixLength: 24}\n"),
			want: []string{"spec.ipv4Subnet", "immutable"}},
		{name: "block size changed", base: fmt.Sprintf(netL3, "u3"),
			doc:  net("u3", "  type: l3\n  ipv4Subnet: {prefix: 10.40.0.0/16, hostLocalPrefixLength: 25}\n"),
			want: []string{"spec.ipv4Subnet", "immutable"}},
		{name: "subnet added", base: fmt.Sprintf(netL3, "u4"),
			doc:  net("u4", "  type: l3\n  ipv4Subnet: {prefix: 10.40.0.0/16, hostLocalPrefixLength: 24}\n  ipv6Subnet: {prefix: 'fd00:40::/48', hostLocalPrefixLength: 64}\n"),
			want: []string{"spec.ipv6Subnet", "cannot be added or removed"}},
		{name: "binding policy with negative priority", doc: kind("NetworkBindingPolicy", "b1", "  network: default\n  priority: -1\n"),
			want: []string{"spec.priority", "greater than or equal to 0"}},
		{name: "binding policy with unknown matchKind", doc: kind("NetworkBindingPolicy", "b2", "  network: default\n  matchKind: Node\n"),
			want: []string{"spec.matchKind", "Unsupported value"}},
		{name: "binding policy without network", doc: kind("NetworkBindingPolicy", "b3", "  priority: 1\n"),
			want: []string{"spec.network", "Required value"}},
		{name: "routing policy without source", doc: kind("NetworkRoutingPolicy", "r1", "  destSelector: {matchLabels: {tier: backend}}\n"),
			want: []string{"spec.srcSelector", "Required value"}},
		{name: "routing policy without destination", doc: kind("NetworkRoutingPolicy", "r2", "  srcSelector: {matchLabels: {tier: frontend}}\n"),
			want: []string{"spec.destSelector", "Required value"}},
		{name: "service policy with name and labels", doc: kind("ServiceRoutingPolicy", "s1", "  srcSelector: {}\n  destSelector: {name: payments, matchLabels: {a: b}}\n"),
			want: []string{"spec.destSelector", "exactly one of name"}},
		{name: "service policy with empty destination", doc: kind("ServiceRoutingPolicy", "s2", "  srcSelector: {}\n  destSelector: {}\n"),
			want: []string{"spec.destSelector", "exactly one of name"}},
		{name: "pool range reversed", doc: kind("LoadBalancerClass", "l1", "  addresses: [192.0.2.20-192.0.2.10]\n"),
			want: []string{"spec.addresses[0]", "must not be above the last"}},
		{name: "pool range across families", doc: kind("LoadBalancerClass", "l2", "  addresses: ['192.0.2.1-fd00::1']\n"),
			want: []string{"spec.addresses[0]", "same IP family"}},
		{name: "pool entry not an address", doc: kind("LoadBalancerClass", "l3", "  addresses: [pool-a]\n"),
			want: []string{"spec.addresses[0]", "first-last range"}},
		{name: "pool without addresses", doc: kind("LoadBalancerClass", "l4", "  addresses: []\n"),
			want: []string{"spec.addresses", "at least 1"}},
		{name: "pool namespaceSelector with a bad operator", doc: kind("LoadBalancerClass", "l5", "  addresses: [192.0.2.0/28]\n  namespaceSelector: {matchExpressions: [{key: team, operator: Equals, values: [a]}]}\n"),
			want: []string{"spec.namespaceSelector", "operator must be In, NotIn, Exists or DoesNotExist"}},
		{name: "pool request selector In without values", doc: kind("LoadBalancerClass", "l6", "  addresses: [192.0.2.0/28]\n  addressRequestNamespaceSelector: {matchExpressions: [{key: team, operator: In}]}\n"),
			want: []string{"spec.addressRequestNamespaceSelector", "values exactly for In and NotIn"}},
		{name: "allocation prefix not a CIDR", doc: kind("Allocation", "a1", "  network: default\n  node: n1\n  prefixes: [10.0.0.0/99]\n"),
			want: []string{"spec.prefixes[0]", "must be a CIDR"}},
		{name: "underlay locator not IPv6", doc: kind("UnderlayEndpoint", "e1", "  node: n1\n  locator: 10.0.0.0/24\n"),
			want: []string{"spec.locator", "must be an IPv6 prefix"}},
		{name: "underlay address invalid", doc: kind("UnderlayEndpoint", "e2", "  node: n1\n  addresses: [10.0.0.300]\n"),
			want: []string{"spec.addresses[0]", "must be an IP address"}},
		{name: "endpoint MAC invalid", doc: nsKind("NetworkEndpoint", "p1", "  network: default\n  node: n1\n  mac: 'AA:BB:CC:DD:EE:FF'\n"),
			want: []string{"spec.mac"}},
		{name: "fdb negative sequence", doc: kind("FDBEntry", "f1", "  network: s\n  mac: 'aa:bb:cc:dd:ee:ff'\n  node: n1\n  sequence: -2\n"),
			want: []string{"spec.sequence", "greater than or equal to 0"}},
		{name: "neighbor address invalid", doc: kind("Neighbor", "h1", "  network: s\n  address: '10.0.0'\n  mac: 'aa:bb:cc:dd:ee:ff'\n"),
			want: []string{"spec.address", "must be an IP address"}},
	}
}

// TestInvalidObjectsRejected checks that each invalid object is refused by a
// real kube-apiserver with a message naming the offending field.
func TestInvalidObjectsRejected(t *testing.T) {
	env := cptest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cases := invalidCases()
	if len(cases) < 20 {
		t.Fatalf("the table must hold at least 20 cases, has %d", len(cases))
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			obj := decode(t, tc.doc)
			var err error
			if tc.base != "" {
				base := decode(t, tc.base)
				if err := env.Client.Create(ctx, base); err != nil {
					t.Fatalf("create base object: %v", err)
				}
				obj.SetResourceVersion(base.GetResourceVersion())
				err = env.Client.Update(ctx, obj)
			} else {
				err = env.Client.Create(ctx, obj)
			}
			if err == nil {
				t.Fatalf("accepted, want a rejection naming %v", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("rejection %q does not contain %q", err, w)
				}
			}
		})
	}
}
