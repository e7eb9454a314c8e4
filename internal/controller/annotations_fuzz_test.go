package controller

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/validation/path"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/model/ipam"
	"github.com/lace-cni/lace/pkg/scheme"
)

// The annotations lace-controller reads are written by users (a pod's
// fixed addresses and MAC) or by itself and then open to anyone who may
// edit the object (moves, freezes, standbys). Each target feeds arbitrary
// strings and checks they are used as written, or refused as a whole.

// FuzzPodAddressAnnotations: lace-cni.io/ip-addresses (comma-separated
// addresses, or prefixes, of an l2 network's subnets, one per family)
// and lace-cni.io/mac-address. A pod asking for anything that is not
// that is refused (the caller assigns nothing then); a pod not refused
// gets exactly what it asked for.
func FuzzPodAddressAnnotations(f *testing.F) {
	for _, s := range [][2]string{
		{"10.50.0.5", ""}, {"10.50.0.5, fd00:50::5", "52:54:00:12:34:56"}, {"10.50.0.5/24", ""}, {"10.50.0.5,10.50.0.6", ""},
		{"10.50.0.0", ""}, {"10.50.0.1", ""}, {"10.50.0.255", ""}, {"10.51.0.5", ""}, {"fd00:50::5%eth0", ""}, {"::ffff:10.50.0.5", ""},
		{"10.50.0.5,", ""}, {"", "01:00:5e:00:00:01"}, {"", "0a:58:0a:32:00:05"}, {"", "00:00:00:00:00:00"},
		{"", "02:00:5e:10:00:00:00:01"}, {"", "5254.0012.3456"}, {" ", "52-54-00-12-34-56"},
	} {
		f.Add(s[0], s[1])
	}
	nw := &lacev1.Network{ObjectMeta: metav1.ObjectMeta{Name: "vms"}, Spec: lacev1.NetworkSpec{Type: lacev1.NetworkTypeL2,
		IPv4Subnet: &lacev1.Subnet{Prefix: "10.50.0.0/24"}, IPv6Subnet: &lacev1.Subnet{Prefix: "fd00:50::/64"}}}
	subnet := map[bool]netip.Prefix{true: netip.MustParsePrefix("10.50.0.0/24"), false: netip.MustParsePrefix("fd00:50::/64")}
	f.Fuzz(func(t *testing.T, ips, mac string) {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "p", Annotations: map[string]string{}}}
		if ips != "" {
			pod.Annotations[lacev1.AnnotationIPAddresses] = ips
		}
		if mac != "" {
			pod.Annotations[lacev1.AnnotationMACAddress] = mac
		}
		rq, why := parseRequest(pod, nw, nil)

		want := map[bool]netip.Addr{}
		valid := true
		if ips != "" {
			for _, s := range strings.Split(ips, ",") {
				s = strings.TrimSpace(s)
				a, err := netip.ParseAddr(s)
				if p, perr := netip.ParsePrefix(s); perr == nil {
					a, err = p.Addr(), nil
				}
				if err != nil || !ipam.L2Assignable(subnet[a.Is4()], a) || want[a.Is4()].IsValid() {
					valid = false
					break
				}
				want[a.Is4()] = a
			}
		}
		var wantMAC net.HardwareAddr
		if mac != "" {
			m, err := net.ParseMAC(mac)
			valid = valid && err == nil && ipam.L2Claimable(m)
			wantMAC = m
		}
		switch {
		case !valid && why == nil:
			t.Fatalf("addresses %q, MAC %q are no valid request, yet accepted as %v %v", ips, mac, rq.addrs, rq.mac)
		case valid && why != nil:
			t.Fatalf("addresses %q, MAC %q refused: %s", ips, mac, why.msg)
		case why != nil && why.reason != ReasonInvalidRequest:
			t.Fatalf("addresses %q, MAC %q refused as %s", ips, mac, why.reason)
		case why == nil && (len(rq.addrs) != len(want) || rq.addrs[true] != want[true] || rq.addrs[false] != want[false] || rq.mac.String() != wantMAC.String()):
			t.Fatalf("addresses %q, MAC %q read as %v %v, want %v %v", ips, mac, rq.addrs, rq.mac, want, wantMAC)
		}
	})
}

// FuzzStandbyEndpointAnnotation: lace-cni.io/standby-endpoint names the
// NetworkEndpoint ("namespace/name") a MAC stands by for. While that is
// a live endpoint other than the new target, the standby stays; anything
// else (gone, not a key at all) gives way to the target: its node stands
// by, with the next sequence and the target's key, and nothing else of
// the entry changes.
func FuzzStandbyEndpointAnnotation(f *testing.F) {
	for _, s := range []string{"default/other", "default/target", "default/gone", "", "default/", "/", "/other", "default",
		"default/other/x", "other-ns/other", "Default/Other", "default/" + strings.Repeat("x", 300)} {
		f.Add(s, true)
		f.Add(s, false)
	}
	f.Fuzz(func(t *testing.T, cur string, standing bool) {
		ctx := context.Background()
		fdb := &lacev1.FDBEntry{ObjectMeta: metav1.ObjectMeta{Name: "vms.52-54-00-00-00-01"},
			Spec: lacev1.FDBEntrySpec{Network: "vms", MAC: "52:54:00:00:00:01", Node: "n1", Sequence: 3}}
		if cur != "" {
			fdb.Annotations = map[string]string{lacev1.AnnotationStandbyEndpoint: cur}
		}
		if standing {
			fdb.Spec.Standby = "n2"
		}
		other := &lacev1.NetworkEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "other"}, Spec: lacev1.NetworkEndpointSpec{Node: "n3"}}
		target := &lacev1.NetworkEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "target"}, Spec: lacev1.NetworkEndpointSpec{Node: "n2"}}
		c := restNames{fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(fdb, other, target).Build()}
		r := &L2AddressReconciler{Client: c, APIReader: c}
		if err := c.Get(ctx, client.ObjectKeyFromObject(fdb), fdb); err != nil {
			t.Fatal(err)
		}
		before := fdb.DeepCopy()
		if err := r.standBy(ctx, fdb, target); err != nil {
			t.Fatalf("standby annotation %q: %v (the target never stands by)", cur, err)
		}
		var after lacev1.FDBEntry
		if err := c.Get(ctx, client.ObjectKeyFromObject(fdb), &after); err != nil {
			t.Fatal(err)
		}
		keep := cur == "default/other" || cur == "default/target" && standing
		if keep {
			if after.ResourceVersion != before.ResourceVersion {
				t.Fatalf("standby annotation %q (a live endpoint's): the entry changed to %+v %v", cur, after.Spec, after.Annotations)
			}
			return
		}
		want := before.DeepCopy()
		want.Spec.Standby, want.Spec.Sequence = "n2", 4
		if want.Annotations == nil {
			want.Annotations = map[string]string{}
		}
		want.Annotations[lacev1.AnnotationStandbyEndpoint] = "default/target"
		if after.Spec != want.Spec || len(after.Annotations) != len(want.Annotations) ||
			after.Annotations[lacev1.AnnotationStandbyEndpoint] != "default/target" {
			t.Fatalf("standby annotation %q: the entry is %+v %v, want %+v %v", cur, after.Spec, after.Annotations, want.Spec, want.Annotations)
		}
	})
}

// restNames is the fake client refusing, as the real one does before it
// sends anything (client-go's Request.Name and Namespace), a read by a
// name no request path can carry: the fake would answer NotFound.
type restNames struct{ client.Client }

func (c restNames) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if key.Name == "" {
		return errors.New("resource name may not be empty")
	}
	for _, s := range []string{key.Namespace, key.Name} {
		if msgs := path.IsValidPathSegmentName(s); s != "" && len(msgs) > 0 {
			return fmt.Errorf("invalid resource name %q: %v", s, msgs)
		}
	}
	return c.Client.Get(ctx, key, obj, opts...)
}

// FuzzMovesAnnotations: lace-cni.io/moves (the times, in Unix
// milliseconds, of a learned binding's recent moves) and
// lace-cni.io/frozen-until (RFC 3339). A move keeps only the entries
// that are numbers within moveWindow, adds its own, and freezes the
// binding at its maxMoves-th, forgetting them; at most maxMoves entries
// are ever kept. A freeze lasts until the time written, or not at all
// when that is no time or past.
func FuzzMovesAnnotations(f *testing.F) {
	now := time.Date(2026, 11, 27, 9, 0, 0, 0, time.UTC)
	ms := func(d time.Duration) string { return strconv.FormatInt(now.Add(d).UnixMilli(), 10) }
	for _, s := range [][2]string{
		{"", ""}, {ms(-time.Second), ""}, {strings.Join([]string{ms(-4 * time.Second), ms(-3 * time.Second), ms(-2 * time.Second), ms(-time.Second)}, ","), ""},
		{ms(-time.Hour), now.Add(time.Minute).Format(time.RFC3339)}, {"x,,1,-5", "yesterday"}, {ms(time.Hour), now.Add(-time.Minute).Format(time.RFC3339)},
		{"9223372036854775807,-9223372036854775808", "9999-12-31T23:59:59Z"}, {" 1", "2026-11-27T09:00:00+14:00"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, moves, frozen string) {
		o := &lacev1.FDBEntry{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{
			lacev1.AnnotationMoves: moves, lacev1.AnnotationFrozenUntil: frozen}}}
		until, err := time.Parse(time.RFC3339, frozen)
		d := frozenFor(o, now)
		switch {
		case d < 0:
			t.Fatalf("frozen-until %q: frozen for %v", frozen, d)
		case (err != nil || !until.After(now)) && d != 0:
			t.Fatalf("frozen-until %q is no time to come, yet frozen for %v", frozen, d)
		case err == nil && until.After(now) && d != until.Sub(now):
			t.Fatalf("frozen-until %q: frozen for %v, want %v", frozen, d, until.Sub(now))
		}

		var recent int
		for _, s := range strings.Split(moves, ",") {
			if v, err := strconv.ParseInt(s, 10, 64); err == nil && now.Sub(time.UnixMilli(v)) < moveWindow {
				recent++
			}
		}
		r := &L2LearnReconciler{Now: func() time.Time { return now }}
		froze := r.moved(o, holder{label: lacev1.LabelEndpointUID, annotation: lacev1.AnnotationEndpoint, uid: "u", key: "default/p"})
		ann := o.GetAnnotations()
		if froze != (recent+1 >= maxMoves) {
			t.Fatalf("moves %q (%d recent): froze=%v at a move", moves, recent, froze)
		}
		kept := []string{}
		if ann[lacev1.AnnotationMoves] != "" {
			kept = strings.Split(ann[lacev1.AnnotationMoves], ",")
		}
		if froze {
			if len(kept) != 0 || ann[lacev1.AnnotationFrozenUntil] != now.Add(moveWindow).Format(time.RFC3339) {
				t.Fatalf("moves %q: a freeze left moves %q, frozen until %q", moves, ann[lacev1.AnnotationMoves], ann[lacev1.AnnotationFrozenUntil])
			}
			return
		}
		if len(kept) != recent+1 || len(kept) > maxMoves || kept[len(kept)-1] != ms(0) || ann[lacev1.AnnotationFrozenUntil] != frozen {
			t.Fatalf("moves %q (%d recent) became %q", moves, recent, ann[lacev1.AnnotationMoves])
		}
		for _, s := range kept {
			if v, err := strconv.ParseInt(s, 10, 64); err != nil || now.Sub(time.UnixMilli(v)) >= moveWindow {
				t.Fatalf("moves %q kept %q", moves, s)
			}
		}
		if ann[lacev1.AnnotationEndpoint] != "default/p" || o.GetLabels()[lacev1.LabelEndpointUID] != "u" {
			t.Fatalf("the move did not relabel the binding: %v %v", o.GetLabels(), ann)
		}
	})
}
