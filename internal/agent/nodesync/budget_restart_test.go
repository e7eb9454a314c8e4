package nodesync

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/lace-cni/lace/internal/datapath"
	"github.com/lace-cni/lace/internal/model"
	"github.com/lace-cni/lace/internal/tables"
)

// programmedOf is lace_services as an agent that applied services leaves
// it (datapath.ProgrammedFrontends after a restart).
func programmedOf(svcs []tables.Service) map[datapath.ServiceKey]datapath.ProgrammedFrontend {
	out := map[datapath.ServiceKey]datapath.ProgrammedFrontend{}
	for _, s := range svcs {
		out[datapath.ServiceKey{VIP: s.VIP, Proto: s.Proto, Port: s.Port}] = datapath.ProgrammedFrontend{
			External: s.External(), Backends: len(s.Backends), SourceRanges: len(s.SourceRanges)}
	}
	return out
}

// TestServiceBudgetRestartKeepsVerdicts: a restarted agent starts its
// budget from what the agent before it programmed, so the same Services
// get the same verdicts: tenant a's old Service, refused for its growth,
// stays refused and tenant b's newer working Service stays programmed;
// growth made while no agent ran is judged as growth. Before, a
// restarted agent judged by age alone: the grown old Service was
// admitted whole and tenant b's Service, programmed until then, was
// dropped.
func TestServiceBudgetRestartKeepsVerdicts(t *testing.T) {
	in, svc := budgetFixture()
	budget := model.Budget{ServiceFrontends: 25, TotalFrontends: 30}
	old, victim, grown := svc("a", "old", 0, 1, "1"), svc("b", "web", 5, 10, "1"), svc("a", "old", 0, 21, "2")
	oldKey, victimKey := model.ServiceKey{Namespace: "a", Name: "old"}, model.ServiceKey{Namespace: "b", Name: "web"}
	check := func(what string, c *serviceCache, st model.ServiceState) {
		t.Helper()
		if r, ok := c.refused[victimKey]; ok {
			t.Errorf("%s: tenant b's working Service refused: %+v", what, r)
		}
		if r := c.refused[oldKey]; r.Reason != model.ReasonMapsFull {
			t.Errorf("%s: the grown Service: %+v, want %s", what, r, model.ReasonMapsFull)
		}
		if len(st.Services) != 10 {
			t.Errorf("%s: %d frontends programmed, want tenant b's 10", what, len(st.Services))
		}
	}

	// The agent before: old grows past the maps and is refused.
	before := &serviceCache{budget: budget}
	before.updateLists(in, true, []*corev1.Service{old, victim}, nil)
	st, _, _ := before.updateLists(in, false, []*corev1.Service{grown, victim}, nil)
	check("before the restart", before, st)

	// Restarted with the same Services: the same verdicts.
	after := &serviceCache{budget: budget, programmed: programmedOf(st.Services)}
	st, _, _ = after.updateLists(in, true, []*corev1.Service{grown, victim}, nil)
	check("after the restart", after, st)
	if after.programmed != nil {
		t.Error("the programmed frontends are kept after the first admission")
	}
	// Still after: it shrinks back and is admitted again.
	if after.updateLists(in, false, []*corev1.Service{svc("a", "old", 0, 1, "3"), victim}, nil); len(after.refused) != 0 {
		t.Errorf("after shrinking: %v", after.refused)
	}

	// old grew while no agent ran (the agent before had programmed both
	// at their first size): its growth is judged as growth.
	before = &serviceCache{budget: budget}
	st, _, _ = before.updateLists(in, true, []*corev1.Service{old, victim}, nil)
	down := &serviceCache{budget: budget, programmed: programmedOf(st.Services)}
	st, _, _ = down.updateLists(in, true, []*corev1.Service{grown, victim}, nil)
	check("grown while no agent ran", down, st)

	// The chart's maps grew between the runs: the limits are today's,
	// so what was refused for want of room now fits.
	roomy := budget
	roomy.TotalFrontends = 40
	wide := &serviceCache{budget: roomy, programmed: programmedOf(st.Services)}
	if st, _, _ = wide.updateLists(in, true, []*corev1.Service{grown, victim}, nil); len(wide.refused) != 0 || len(st.Services) != 31 {
		t.Errorf("with larger maps: refused %v, %d frontends; want none refused, 31", wide.refused, len(st.Services))
	}
	// They shrank: what was admitted keeps its room oldest first, the
	// newest admitted Service is the one that goes.
	tight := budget
	tight.TotalFrontends = 25
	narrow := &serviceCache{budget: tight, programmed: programmedOf(st.Services)}
	narrow.updateLists(in, true, []*corev1.Service{grown, victim}, nil)
	if r := narrow.refused[victimKey]; r.Reason != model.ReasonMapsFull || len(narrow.refused) != 1 {
		t.Errorf("with smaller maps: refused %v, want only tenant b's newer Service", narrow.refused)
	}
}
