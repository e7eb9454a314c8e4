package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"

	"github.com/vishvananda/netlink"
)

// rootState is what the lab must never change in the root namespaces: the
// network namespace's links, addresses, routes, rules and nftables ruleset,
// and the mount namespace's mounts.
type rootState struct {
	Links, Addrs, Routes, Rules, Nft, Mounts []string
}

func snapshotRoot() (rootState, error) {
	var s rootState
	links, err := netlink.LinkList()
	if err != nil {
		return s, fmt.Errorf("list links: %w", err)
	}
	names := map[int]string{}
	for _, l := range links {
		a := l.Attrs()
		names[a.Index] = a.Name
		s.Links = append(s.Links, fmt.Sprintf("%d %s %s mtu %d master %d", a.Index, a.Name, l.Type(), a.MTU, a.MasterIndex))
	}
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return s, fmt.Errorf("list addresses: %w", err)
	}
	for _, a := range addrs {
		s.Addrs = append(s.Addrs, fmt.Sprintf("%s %s", names[a.LinkIndex], a.IPNet))
	}
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: 0}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return s, fmt.Errorf("list routes: %w", err)
	}
	for _, r := range routes {
		s.Routes = append(s.Routes, fmt.Sprintf("table %d %v via %v dev %s proto %d", r.Table, r.Dst, r.Gw, names[r.LinkIndex], r.Protocol))
	}
	rules, err := netlink.RuleList(netlink.FAMILY_ALL)
	if err != nil {
		return s, fmt.Errorf("list rules: %w", err)
	}
	for _, r := range rules {
		s.Rules = append(s.Rules, fmt.Sprintf("%d from %v to %v table %d mark %d", r.Priority, r.Src, r.Dst, r.Table, r.Mark))
	}
	nft, err := exec.Command("nft", "list", "ruleset").CombinedOutput()
	if err != nil {
		return s, fmt.Errorf("nft list ruleset: %v: %s", err, nft)
	}
	for _, l := range strings.Split(string(nft), "\n") {
		if strings.TrimSpace(l) != "" {
			s.Nft = append(s.Nft, l)
		}
	}
	mounts, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return s, err
	}
	for _, l := range strings.Split(string(mounts), "\n") {
		// Other test packages running meanwhile bind namespaces under
		// /run/netns and mount bpffs instances under /tmp; every other
		// mount point is the machine's, or a leak of the lab's.
		if f := strings.Fields(l); len(f) >= 3 && !strings.HasPrefix(f[1], "/run/netns/") && !strings.HasPrefix(f[1], os.TempDir()+"/") {
			s.Mounts = append(s.Mounts, f[1]+" "+f[2])
		}
	}
	for _, l := range [][]string{s.Links, s.Addrs, s.Routes, s.Rules, s.Nft, s.Mounts} {
		sort.Strings(l)
	}
	return s, nil
}

// diff lists what differs between two snapshots.
func (s rootState) diff(o rootState) []string {
	var out []string
	cmp := func(kind string, a, b []string) {
		in := func(x string, l []string) bool {
			i := sort.SearchStrings(l, x)
			return i < len(l) && l[i] == x
		}
		for _, x := range a {
			if !in(x, b) {
				out = append(out, kind+" removed: "+x)
			}
		}
		for _, x := range b {
			if !in(x, a) {
				out = append(out, kind+" added: "+x)
			}
		}
	}
	cmp("link", s.Links, o.Links)
	cmp("address", s.Addrs, o.Addrs)
	cmp("route", s.Routes, o.Routes)
	cmp("rule", s.Rules, o.Rules)
	cmp("nftables line", s.Nft, o.Nft)
	cmp("mount", s.Mounts, o.Mounts)
	return out
}

func (s rootState) String() string {
	return strings.Join(append(append(append(s.Links, s.Addrs...), s.Routes...), s.Rules...), "\n")
}
