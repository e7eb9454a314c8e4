package cni

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamclaimsv1 "github.com/lace-cni/lace/api/ipamclaims/v1alpha1"

	lacev1 "github.com/lace-cni/lace/api/v1alpha1"
	"github.com/lace-cni/lace/internal/testutil"
	"github.com/lace-cni/lace/pkg/cniapi"
)

// agentState is what a CNI request can allocate: records, data plane
// entries, interfaces and NetworkEndpoints, each as a set of keys.
type agentState map[string][]string

func stateOf(t testing.TB, a *testAgent) agentState {
	st := agentState{}
	for _, e := range a.cp.all() {
		st["checkpoint"] = append(st["checkpoint"], fmt.Sprintf("%s %s %v ready=%v", e.HostIf, e.ContainerID, e.Addrs, e.Ready))
	}
	a.dp.mu.Lock()
	for k := range a.dp.eps {
		st["endpoints"] = append(st["endpoints"], k)
	}
	for k := range a.dp.ports {
		st["ports"] = append(st["ports"], fmt.Sprint(k))
	}
	for k := range a.dp.attached {
		st["programs"] = append(st["programs"], k)
	}
	a.dp.mu.Unlock()
	a.node.mu.Lock()
	for k := range a.node.pods {
		st["interfaces"] = append(st["interfaces"], k)
	}
	a.node.mu.Unlock()
	var nes lacev1.NetworkEndpointList
	if err := a.c.List(context.Background(), &nes); err != nil {
		t.Fatal(err)
	}
	for _, ne := range nes.Items {
		st["networkendpoints"] = append(st["networkendpoints"], ne.Namespace+"/"+ne.Name)
	}
	for _, v := range st {
		sort.Strings(v)
	}
	return st
}

// grown names what after holds that before did not.
func grown(before, after agentState) []string {
	var out []string
	for kind, keys := range after {
		for _, k := range keys {
			if !slices.Contains(before[kind], k) {
				out = append(out, kind+": "+k)
			}
		}
	}
	return out
}

// cniContainerID is the CNI spec's container ID.
var cniContainerID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.\-]*$`)

// badRequest says why the spec (not the server's code) makes body a
// request the agent must refuse, if it does.
func badRequest(body []byte) string {
	var req cniapi.Request
	if err := json.Unmarshal(body, &req); err != nil {
		return "not a request: " + err.Error()
	}
	switch req.Command {
	case "ADD", "DEL", "CHECK":
		if !cniContainerID.MatchString(req.ContainerID) {
			return fmt.Sprintf("%s for container ID %q, which is none", req.Command, req.ContainerID)
		}
	case "STATUS", "GC":
	default:
		return fmt.Sprintf("command %q", req.Command)
	}
	if req.Command == "ADD" || req.Command == "GC" {
		var conf map[string]any
		if err := json.Unmarshal(req.Config, &conf); err != nil {
			return req.Command + " without a configuration object"
		}
	}
	// A retried ADD is answered from the checkpoint by its container
	// alone (c1 is attached in FuzzCNIServer's baseline).
	if req.Command == "ADD" && (req.Args["K8S_POD_NAMESPACE"] == "" || req.Args["K8S_POD_NAME"] == "") && req.ContainerID != "c1" {
		return "ADD without the pod's name"
	}
	return ""
}

// cniBaseline is the agent FuzzCNIServer starts every input from: pod
// p1 attached as container c1, pod p2 not yet. Building one costs an ADD
// (checkpoint writes), so it is kept while inputs leave it as it was.
type cniBaseline struct {
	a      *testAgent
	h      http.Handler
	state  agentState
	dir    string
	cancel context.CancelFunc
}

func newCNIBaseline(t *testing.T) *cniBaseline {
	dir, err := os.MkdirTemp("", "lace-fuzz-cni-")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	b := &cniBaseline{dir: dir, cancel: cancel}
	if b.a, err = newTestAgentIn(ctx, dir, 29, pod("p1"), pod("p2")); err != nil {
		b.close()
		t.Fatal(err)
	}
	b.a.sync.applied = true
	if _, err := b.a.Handle(ctx, addReq("c1", "p1")); err != nil {
		b.close()
		t.Fatal(err)
	}
	// ADD writes the NetworkEndpoint after it answers: wait for it, or
	// it would seem allocated by the next request.
	testutil.Eventually(t, 5*time.Second, time.Millisecond, "p1's NetworkEndpoint", func() error {
		var ne lacev1.NetworkEndpoint
		return b.a.c.Get(ctx, types.NamespacedName{Namespace: "default", Name: "p1"}, &ne)
	})
	b.h, b.state = b.a.cniHandler(), stateOf(t, b.a)
	return b
}

func (b *cniBaseline) close() {
	b.cancel()
	_ = os.RemoveAll(b.dir)
}

// serveBody posts body to h as lace-cni would, and decodes the answer.
func serveBody(t *testing.T, h http.Handler, body []byte) cniapi.Response {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/cni", bytes.NewReader(body)))
	var out cniapi.Response
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
		t.Fatalf("request %q answered %d %q: no CNI answer: %v", body, rec.Code, rec.Body.Bytes(), err)
	}
	return out
}

// FuzzCNIServer posts arbitrary bodies to the agent's CNI handler (the
// one Serve serves on the socket) with the package's fakes for the
// kernel, the data plane and the API. The server never panics and always
// answers a CNI answer; a request the spec makes bad is refused; a
// refused request allocates nothing (no record, entry, interface or
// NetworkEndpoint appears); and the server serves the next request.
func FuzzCNIServer(f *testing.F) {
	add := func(container, pod string) string {
		b, _ := json.Marshal(addReq(container, pod))
		return string(b)
	}
	for _, s := range []string{
		add("c1", "p1"), add("c2", "p2"), add("c3", "nobody"), add("", "p2"), add("../x", "p2"),
		`{"command":"DEL","containerID":"c1"}`, `{"command":"DEL","containerID":"c9"}`, `{"command":"DEL"}`,
		`{"command":"CHECK","containerID":"c1"}`, `{"command":"STATUS"}`,
		`{"command":"GC","config":{"cni.dev/valid-attachments":[{"containerID":"c1","ifname":"eth0"}]}}`,
		`{"command":"GC","config":{"cni.dev/valid-attachments":{}}}`, `{"command":"GC"}`,
		`{"command":"ADD","containerID":"c2","args":{"K8S_POD_NAMESPACE":"default","K8S_POD_NAME":"p2"},"config":"x"}`,
		// An ADD whose CNI version no result can be given in attached
		// the pod before failing.
		`{"command":"ADD","containerID":"c2","args":{"K8S_POD_NAMESPACE":"default","K8S_POD_NAME":"p2"},"config":{"cniVersion":"9.9.9"}}`,
		`{"command":"ADD","containerID":"c2","args":{"K8S_POD_NAME":"p2"},"config":{}}`,
		`{"command":"ADD","containerID":"c2","pluginPID":-1,"netns":"rel","args":{"K8S_POD_NAMESPACE":"default","K8S_POD_NAME":"p2","K8S_POD_UID":"x"},"config":{}}`,
		`{"command":"VERSION"}`, `{"command":"add"}`, `{}`, `null`, `[]`, ``, `{"command":`, `{"command":"STATUS"}{"command":"ADD"}`,
		`{"command":"CHECK","containerID":"c1","pluginPID":1e99}`,
	} {
		f.Add([]byte(s))
	}
	var base *cniBaseline
	f.Cleanup(func() {
		if base != nil {
			base.close()
		}
	})
	f.Fuzz(func(t *testing.T, body []byte) {
		if base == nil {
			base = newCNIBaseline(t)
		}
		a := base.a
		out := serveBody(t, base.h, body)
		var req cniapi.Request
		_ = json.Unmarshal(body, &req)
		// An input that changed the agent leaves the next one a fresh
		// agent: each input starts from the same state.
		if out.Error == nil && (req.Command == "ADD" || req.Command == "DEL" || req.Command == "GC") {
			defer func() { base.close(); base = nil }()
		}
		bad := badRequest(body)
		if out.Error == nil && bad != "" {
			t.Fatalf("bad request (%s) served: %q answered %s", bad, body, out.Result)
		}
		if out.Error != nil && len(out.Result) > 0 {
			t.Fatalf("an answer with both an error and a result: %+v", out)
		}
		after := stateOf(t, a)
		if out.Error != nil {
			if g := grown(base.state, after); len(g) > 0 {
				t.Fatalf("refused request %q (%s) left %v", body, out.Error.Msg, g)
			}
		} else {
			var res map[string]any
			if req.Command == "ADD" && json.Unmarshal(out.Result, &res) != nil {
				t.Fatalf("ADD served with result %q", out.Result)
			}
		}
		if st := serveBody(t, a.cniHandler(), []byte(`{"command":"STATUS"}`)); st.Error != nil {
			t.Fatalf("after %q the agent answers STATUS with %+v", body, st.Error)
		}
		if out.Error != nil && !reflect.DeepEqual(after, base.state) {
			base.close()
			base = nil
		}
	})
}

// FuzzMigrationTargetReady: KubeVirt's migration-target-ready mark is a
// time (RFC 3339); anything else marks no target. A pod whose mark is
// not a time is never judged the newest target, whatever the mark of the
// pod holding the VM's claim, and a pod whose mark is a time is judged
// newest exactly when it is later than the owner's (no mark or not a
// time: never marked).
func FuzzMigrationTargetReady(f *testing.F) {
	for _, s := range [][2]string{
		{"2026-11-27T09:00:00Z", "2026-11-27T08:00:00Z"}, {"2026-11-27T09:00:00Z", "2026-11-27T09:00:00Z"},
		{"2026-11-27T09:00:00+01:00", "2026-11-27T08:30:00Z"}, {"yes", ""}, {"", "2026-11-27T08:00:00Z"},
		{"true", "0001-01-01T00:00:00Z"}, {"2026-11-27T09:00:00.123456789Z", "2026-11-27T09:00:00Z"},
		{"2026-13-01T00:00:00Z", ""}, {"1", "0"},
		// Year 0 is before the zero time, which a mark that is no time
		// reads as: such a mark was judged newer than this owner's.
		{"yes", "0000-01-01T00:00:00Z"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, mine, owner string) {
		withMark := func(name, mark string) *corev1.Pod {
			p := pod(name)
			p.Annotations = map[string]string{lacev1.AnnotationIPAMClaim: "vm"}
			if mark != "" {
				p.Annotations[lacev1.AnnotationMigrationTargetReady] = mark
			}
			return p
		}
		target, src := withMark("target", mine), withMark("src", owner)
		parse := func(mark string) (time.Time, bool) {
			at, err := time.Parse(time.RFC3339, mark)
			return at, err == nil
		}
		mineAt, ok := parse(mine)
		if got := readyAt(target); ok && !got.Equal(mineAt) || !ok && !got.IsZero() {
			t.Fatalf("mark %q read as %v", mine, got)
		}
		s := &Server{reader: claimReader{owner: src}}
		newest, err := s.readyIsNewest(context.Background(), target)
		if err != nil {
			t.Fatal(err)
		}
		// The zero time is how readyAt says "no mark".
		marked := ok && !mineAt.IsZero()
		ownerAt, _ := parse(owner)
		switch {
		case !marked && newest:
			t.Fatalf("mark %q marks no target, yet it is newer than the owner's %q", mine, owner)
		case marked && newest != mineAt.After(ownerAt):
			t.Fatalf("mark %q against the owner's %q: newest=%v", mine, owner, newest)
		}
	})
}

// claimReader answers readyIsNewest's reads: claim "vm", held by owner.
// (A fake client per exec would cost most of the fuzzing time.)
type claimReader struct{ owner *corev1.Pod }

func (r claimReader) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	switch o := obj.(type) {
	case *ipamclaimsv1.IPAMClaim:
		*o = ipamclaimsv1.IPAMClaim{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name},
			Status: ipamclaimsv1.IPAMClaimStatus{OwnerPod: &ipamclaimsv1.OwnerPod{Name: r.owner.Name}}}
	case *corev1.Pod:
		*o = *r.owner
	default:
		return fmt.Errorf("unexpected read of %T", obj)
	}
	return nil
}

func (claimReader) List(context.Context, client.ObjectList, ...client.ListOption) error {
	return errors.New("unexpected list")
}
