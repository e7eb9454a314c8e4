package model

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/lace-cni/lace/internal/tables"
)

// One frontend with more endpoints than the data plane's 16-bit backend
// count is refused by the budget, whatever the per-Service bound: before
// the fix it passed and the datapath's Apply failed the whole sync.
func TestBudgetRefusesFrontendOverBackendIndex(t *testing.T) {
	b := Budget{ServiceFrontends: 8192, ServiceBackends: 65536, TotalFrontends: 65536, TotalBackends: 262144}
	r := b.Admit([]Candidate{
		{Key: ServiceKey{"a", "x"}, Cost: Cost{Frontends: 1, Backends: 65536, FrontendBackends: 65536}},
		{Key: ServiceKey{"a", "ok"}, Cost: Cost{Frontends: 1, Backends: 65535, FrontendBackends: 65535}},
	})
	if got := r[ServiceKey{"a", "x"}]; got.Reason != ReasonServiceOverBudget || !strings.Contains(got.Message, "65535") {
		t.Errorf("1 frontend x 65536 endpoints: %+v, want refused over budget", got)
	}
	if _, ok := r[ServiceKey{"a", "ok"}]; ok {
		t.Errorf("65535 endpoints refused: %v", r)
	}
	// CostOf tracks the largest frontend, not the sum.
	res := ServiceResult{Services: []tables.Service{{Backends: make([]tables.Backend, 3)}, {Backends: make([]tables.Backend, 5)}}}
	if c := CostOf(&res); c.FrontendBackends != 5 || c.Backends != 8 {
		t.Errorf("CostOf: %+v", c)
	}
}

// An old, cheap Service of tenant a grows later (EndpointSlices, ports):
// its growth is judged as the newest demand, so tenant b's newer Service
// that was working keeps working and a's grown Services are refused.
func TestBudgetOldServiceGrowthIsNew(t *testing.T) {
	b := Budget{ServiceFrontends: 8192, ServiceBackends: 65536, TotalFrontends: 65536, TotalBackends: 262144}
	t0 := time.Unix(0, 0)
	victim := Candidate{Key: ServiceKey{"b", "web"}, Created: t0.Add(time.Hour), UID: "v", Cost: Cost{Frontends: 1, Backends: 3}}
	var cands []Candidate
	for i := range 4 {
		cands = append(cands, Candidate{Key: ServiceKey{"a", string(rune('p' + i))}, Created: t0, UID: string(rune('p' + i)),
			Cost: Cost{Frontends: 1, Backends: 1}})
	}
	if r := b.Admit(append(cands, victim)); len(r) != 0 {
		t.Fatalf("before: %v", r)
	}
	// What the agent remembers: everything admitted as it was.
	victim.Admitted = victim.Cost
	for i := range cands {
		cands[i].Admitted = cands[i].Cost
		cands[i].Cost = Cost{Frontends: 1, Backends: 65535} // 66 EndpointSlices each, under every bound
	}
	cands = append(cands, Candidate{Key: ServiceKey{"a", "z"}, Created: t0, UID: "z", Cost: Cost{Frontends: 1, Backends: 262144 - 4*65535}})
	r := b.Admit(append(cands, victim))
	if _, ok := r[victim.Key]; ok {
		t.Errorf("working Service of tenant b evicted by tenant a's growth: %v", r[victim.Key])
	}
	if len(r) == 0 {
		t.Errorf("the maps overflow and nothing is refused")
	}
	for k, v := range r {
		if k.Namespace != "a" || v.Reason != ReasonMapsFull || !strings.Contains(v.Message, "lace_backends") {
			t.Errorf("refused %v: %+v", k, v)
		}
	}
}

// Without any memory (a restarted agent), the namespace share keeps one
// tenant from taking the maps: tenant a's Services past a quarter of the
// maps are refused before the global pass, b's Service is admitted.
func TestBudgetNamespaceShare(t *testing.T) {
	b := Budget{ServiceFrontends: 8192, ServiceBackends: 65536, TotalFrontends: 65536, TotalBackends: 262144,
		NamespaceFrontends: 65536 / 4, NamespaceBackends: 262144 / 4}
	t0 := time.Unix(0, 0)
	var cands []Candidate
	for i := range 5 {
		cands = append(cands, Candidate{Key: ServiceKey{"a", string(rune('p' + i))}, Created: t0, UID: string(rune('p' + i)),
			Cost: Cost{Frontends: 1, Backends: 65535}})
	}
	victim := Candidate{Key: ServiceKey{"b", "web"}, Created: t0.Add(time.Hour), UID: "v", Cost: Cost{Frontends: 1, Backends: 3}}
	r := b.Admit(append(cands, victim))
	if _, ok := r[victim.Key]; ok {
		t.Errorf("tenant b refused: %v", r[victim.Key])
	}
	if len(r) != 4 {
		t.Errorf("refused %d of tenant a's, want 4: %v", len(r), r)
	}
	for _, v := range r {
		if v.Reason != ReasonNamespaceShare || !strings.Contains(v.Message, "namespace a") {
			t.Errorf("refusal: %+v", v)
		}
	}
}

// Per-Service bound on loadBalancerSourceRanges, and the refusal names
// the map that is full.
func TestBudgetSourceRanges(t *testing.T) {
	b := Budget{ServiceSourceRanges: 16, TotalSourceRanges: 40}
	r := b.Admit([]Candidate{
		{Key: ServiceKey{"a", "big"}, Cost: Cost{Frontends: 1, SourceRanges: 17}},
		{Key: ServiceKey{"a", "x"}, Created: time.Unix(1, 0), Cost: Cost{Frontends: 1, SourceRanges: 16}},
		{Key: ServiceKey{"a", "y"}, Created: time.Unix(2, 0), Cost: Cost{Frontends: 1, SourceRanges: 16}},
		{Key: ServiceKey{"a", "z"}, Created: time.Unix(3, 0), Cost: Cost{Frontends: 1, SourceRanges: 16}},
	})
	if v := r[ServiceKey{"a", "big"}]; v.Reason != ReasonServiceOverBudget || !strings.Contains(v.Message, "loadBalancerSourceRanges") {
		t.Errorf("big: %+v", v)
	}
	if v := r[ServiceKey{"a", "z"}]; v.Reason != ReasonMapsFull || !strings.Contains(v.Message, "lace_src_ranges") || strings.Contains(v.Message, "lace_backends") {
		t.Errorf("z: %+v", v)
	}
	if len(r) != 2 {
		t.Errorf("refused: %v", r)
	}
}

// TestAdmitsAllIsAdmitRefusingNone: the running sum's verdict is Admit's
// (it refuses none exactly when AdmitsAll says so), whatever the costs,
// the bounds and what was admitted before, and removing what was added
// leaves nothing.
func TestAdmitsAllIsAdmitRefusingNone(t *testing.T) {
	rng := rand.New(rand.NewPCG(23, 1))
	for round := range 2000 {
		b := Budget{TotalFrontends: rng.IntN(40), TotalBackends: rng.IntN(200), TotalSourceRanges: rng.IntN(10),
			NamespaceFrontends: rng.IntN(20), NamespaceBackends: rng.IntN(100), ServiceFrontends: rng.IntN(8), ServiceBackends: rng.IntN(50)}
		var s Sum
		var cands []Candidate
		for i := range rng.IntN(12) {
			c := Cost{Frontends: 1 + rng.IntN(5), Backends: rng.IntN(30), SourceRanges: rng.IntN(3)}
			c.FrontendBackends = c.Backends
			was := Cost{Frontends: rng.IntN(6), Backends: rng.IntN(30)}
			k := ServiceKey{Namespace: fmt.Sprintf("ns%d", rng.IntN(3)), Name: fmt.Sprintf("s%d", i)}
			cands = append(cands, Candidate{Key: k, UID: k.Name, Created: time.Unix(int64(rng.IntN(5)), 0), Cost: c, Admitted: was})
			s.Add(b, k.Namespace, c)
		}
		refused := b.Admit(cands)
		if all := b.AdmitsAll(&s); all != (len(refused) == 0) {
			t.Fatalf("round %d: AdmitsAll %v, Admit refused %v (budget %+v, candidates %+v)", round, all, refused, b, cands)
		}
		for _, c := range cands {
			s.Remove(b, c.Key.Namespace, c.Cost)
		}
		if s.total != (Cost{}) || len(s.byNS) != 0 || s.over != 0 {
			t.Fatalf("round %d: %+v left after removing everything", round, s)
		}
	}
}
