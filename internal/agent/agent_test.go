package agent

import (
	"encoding/json"
	"net/netip"
	"sort"
	"testing"
)

func TestSyncListTouchesOnlyTheDifference(t *testing.T) {
	type item struct {
		k string
		v int
	}
	cur := []item{{"a", 1}, {"b", 2}, {"c", 3}}
	want := []item{{"a", 1}, {"b", 20}, {"d", 4}}
	var upserts, deletes []string
	err := syncListEq(cur, want, func(i item) string { return i.k },
		func(i item) error { upserts = append(upserts, i.k); return nil },
		func(i item) error { deletes = append(deletes, i.k); return nil })
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(upserts)
	if len(upserts) != 2 || upserts[0] != "b" || upserts[1] != "d" {
		t.Errorf("upserts %v, want [b d] (a is unchanged)", upserts)
	}
	if len(deletes) != 1 || deletes[0] != "c" {
		t.Errorf("deletes %v, want [c]", deletes)
	}
}

// TestResultEveryCNIVersion renders an ADD result in every version lace-cni
// announces, as the runtime's config asks.
func TestResultEveryCNIVersion(t *testing.T) {
	a := &Agent{}
	e := Endpoint{ContainerID: "c1", IfName: "eth0", NetNS: "/run/netns/x", HostIf: "lace0123456789a",
		HostMAC: "02:00:00:00:00:01", PodMAC: "02:00:00:00:00:02",
		Addrs:    []netip.Addr{netip.MustParseAddr("10.1.0.2"), netip.MustParseAddr("fd00::2")},
		Gateways: []netip.Addr{netip.MustParseAddr("10.1.0.1"), netip.MustParseAddr("fd00::1")}}
	for _, v := range []string{"0.4.0", "1.0.0", "1.1.0"} {
		raw, err := a.result(v, e)
		if err != nil {
			t.Fatalf("%s: %v", v, err)
		}
		var r struct {
			CNIVersion string `json:"cniVersion"`
			IPs        []struct {
				Address string `json:"address"`
				Gateway string `json:"gateway"`
			} `json:"ips"`
			Interfaces []struct {
				Name    string `json:"name"`
				Sandbox string `json:"sandbox"`
			} `json:"interfaces"`
		}
		if err := json.Unmarshal(raw, &r); err != nil {
			t.Fatalf("%s: %v", v, err)
		}
		if r.CNIVersion != v || len(r.IPs) != 2 || r.IPs[0].Address != "10.1.0.2/32" || r.IPs[1].Gateway != "fd00::1" ||
			len(r.Interfaces) != 2 || r.Interfaces[1].Sandbox != "/run/netns/x" {
			t.Errorf("%s: result %s", v, raw)
		}
	}
}
