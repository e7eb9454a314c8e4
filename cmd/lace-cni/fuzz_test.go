package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/lace-cni/lace/pkg/cniapi"
)

// The plugin trusts what the container runtime hands it (CNI_* variables
// and the network configuration on stdin) and what the agent answers. The
// fuzz targets here run the plugin against a fake agent on a socket of
// their own: the seams of main.go keep arbitrary configurations away from
// a real agent's socket and from the node's DEL queue.

// fakeAgent answers the plugin over a unix socket and remembers what it
// was asked.
type fakeAgent struct {
	sock string
	mu   sync.Mutex
	reqs [][]byte
	// answer is the body the agent answers a request with.
	answer func(req []byte) []byte
	// down makes the agent unreachable (dialAgent fails).
	down bool
	// socks are the sockets the plugin dialed; queueDirs the DEL queues it
	// asked for.
	socks, queueDirs []string
	queue            string
}

// startFakeAgent serves a fake agent for the whole fuzz run and points
// the plugin's seams at it.
func startFakeAgent(f *testing.F) *fakeAgent {
	dir := f.TempDir()
	a := &fakeAgent{sock: filepath.Join(dir, "agent.sock"), queue: filepath.Join(dir, "del-queue")}
	ln, err := net.Listen("unix", a.sock)
	if err != nil {
		f.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		a.mu.Lock()
		a.reqs = append(a.reqs, body)
		answer := a.answer
		a.mu.Unlock()
		// Each plugin invocation makes a client of its own and never
		// closes it: without this every exec would leave a connection.
		w.Header().Set("Connection", "close")
		_, _ = w.Write(answer(body))
	})}
	go func() { _ = srv.Serve(ln) }()
	f.Cleanup(func() { _ = srv.Close() })

	oldDial, oldQueue, oldStdout := dialAgent, queueDel, stdout
	f.Cleanup(func() { dialAgent, queueDel, stdout = oldDial, oldQueue, oldStdout })
	dialAgent = func(ctx context.Context, sock string) (net.Conn, error) {
		a.mu.Lock()
		a.socks = append(a.socks, sock)
		down := a.down
		a.mu.Unlock()
		if down {
			return nil, errors.New("connection refused (fake agent down)")
		}
		var d net.Dialer
		return d.DialContext(ctx, "unix", a.sock)
	}
	queueDel = func(dir string, req cniapi.Request) error {
		a.mu.Lock()
		a.queueDirs = append(a.queueDirs, dir)
		a.mu.Unlock()
		return cniapi.QueueDel(a.queue, req)
	}
	return a
}

// reset forgets the previous exec.
func (a *fakeAgent) reset(down bool, answer func([]byte) []byte) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.reqs, a.socks, a.queueDirs, a.down, a.answer = nil, nil, nil, down, answer
	_ = os.RemoveAll(a.queue)
}

func (a *fakeAgent) requests(t *testing.T) []cniapi.Request {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []cniapi.Request
	for _, b := range a.reqs {
		var r cniapi.Request
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatalf("the plugin sent a request the agent cannot decode: %v\n%q", err, b)
		}
		out = append(out, r)
	}
	return out
}

// addResult is what the fake agent answers an ADD with.
const addResult = `{"cniVersion":"1.1.0","interfaces":[{"name":"eth0"}],"ips":[{"address":"10.244.0.2/32"}]}`

// answerByCommand is a well-behaved agent: an ADD gets a result, a CHECK
// an error (so the plugin's error path is taken too), the rest success.
func answerByCommand(body []byte) []byte {
	var r cniapi.Request
	_ = json.Unmarshal(body, &r)
	switch r.Command {
	case "ADD":
		return []byte(`{"result":` + addResult + `}`)
	case "CHECK":
		return []byte(`{"error":{"code":11,"msg":"not there","details":"fake"}}`)
	}
	return []byte(`{}`)
}

// cniEnv is every variable skel reads.
var cniEnv = []string{"CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH", "CNI_NETNS_OVERRIDE"}

// runPlugin runs the plugin's main as the runtime would, with env and
// stdin, and returns its error and what it printed.
func runPlugin(t *testing.T, env map[string]string, stdin []byte) (*types.Error, []byte) {
	for _, k := range cniEnv {
		t.Setenv(k, env[k])
	}
	dir := t.TempDir()
	in, out := filepath.Join(dir, "stdin"), filepath.Join(dir, "stdout")
	if err := os.WriteFile(in, stdin, 0o600); err != nil {
		t.Fatal(err)
	}
	inF, err := os.Open(in)
	if err != nil {
		t.Fatal(err)
	}
	defer inF.Close()
	outF, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer outF.Close()
	oldIn, oldOut, oldErr, oldStdout := os.Stdin, os.Stdout, os.Stderr, stdout
	os.Stdin, os.Stdout, os.Stderr, stdout = inF, outF, outF, outF
	e := skel.PluginMainFuncsWithError(cniFuncs, pluginVersions, about)
	os.Stdin, os.Stdout, os.Stderr, stdout = oldIn, oldOut, oldErr, oldStdout
	printed, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return e, printed
}

// refArgs reads CNI_ARGS as the spec writes it: KEY=VALUE pairs split by
// semicolons; a pair without "=" says nothing.
func refArgs(s string) map[string]string {
	out := map[string]string{}
	for _, kv := range strings.Split(s, ";") {
		if i := strings.IndexByte(kv, '='); i >= 0 {
			out[kv[:i]] = kv[i+1:]
		}
	}
	return out
}

func sameJSON(a, b []byte) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil && reflect.DeepEqual(x, y)
}

var forwarded = map[string]bool{"ADD": true, "DEL": true, "CHECK": true, "STATUS": true, "GC": true}

// FuzzCNIPlugin feeds the plugin arbitrary CNI_* variables and stdin.
// Whatever the input, it does not panic; a configuration Lace cannot
// read is an error that never reaches the agent; and what it forwards
// is what it was given: the command, container, netns, interface,
// CNI_ARGS and the configuration, and the agent's result as printed.
func FuzzCNIPlugin(f *testing.F) {
	a := startFakeAgent(f)
	conf := func(extra string) []byte {
		return []byte(`{"cniVersion":"1.1.0","name":"lace","type":"lace"` + extra + `}`)
	}
	const podArgs = "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=p1;K8S_POD_UID=u1"
	for _, cmd := range []string{"ADD", "DEL", "CHECK", "STATUS", "GC", "VERSION", "", "add"} {
		f.Add(cmd, "0123abcd", "/run/netns/x", "eth0", podArgs, conf(""), false)
	}
	f.Add("ADD", "c1", "/run/netns/x", "eth0", podArgs, conf(`,"agentSocket":"/tmp/other.sock"`), false)
	f.Add("DEL", "c1", "", "eth0", "K8S_POD_NAME=p;;=;x", conf(`,"delQueueDir":"/var/lib/elsewhere"`), true)
	f.Add("ADD", "c1", "/run/netns/x", "eth0", "K8S_POD_NAME= p1 ;x=y=z;K8S_POD_NAME=p2", conf(""), false)
	f.Add("DEL", "bad/id", "", "eth0", "", conf(""), true)
	f.Add("ADD", "c1", "/run/netns/x", "eth0", "", conf(""), true)
	f.Add("GC", "", "", "", "", []byte(`{"cniVersion":"1.1.0","name":"lace","cni.dev/valid-attachments":[{"containerID":"c1","ifname":"eth0"}]}`), false)
	f.Add("ADD", "c1", "/run/netns/x", "eth0", "", []byte(`{"cniVersion":"1.1.0","name":"lace","agentSocket":5}`), false)
	f.Add("ADD", "c1", "/run/netns/x", "eth0", "", []byte(`{"cniVersion":"1.1.0","name":"lace"} trailing`), false)
	f.Add("ADD", "c1", "/run/netns/x", "eth0", "", []byte(`{"cniVersion":"1.1.0","name":"lace","x":"<\u00e9>"}`), false)
	f.Add("ADD", "c1", "/run/netns/x", "eth0", "", []byte(`[]`), false)
	f.Add("CHECK", "c1", "/run/netns/x", "a-very-long-interface", "", conf(""), false)
	f.Add("STATUS", "", "", "", "", conf(`,"cniVersion":"0.4.0"`), false)

	f.Fuzz(func(t *testing.T, cmd, containerID, netns, ifName, cniArgs string, stdin []byte, down bool) {
		// Environment variables cannot hold NUL.
		clean := func(s string) string { return strings.ReplaceAll(s, "\x00", "") }
		cmd, containerID, ifName, cniArgs = clean(cmd), clean(containerID), clean(ifName), clean(cniArgs)
		// The netns is opened (skel checks it is not the plugin's own):
		// kept under a directory that does not exist, so no input names
		// a FIFO or device that would block the open.
		if netns != "" {
			netns = "/nonexistent-lace-fuzz/" + strings.ReplaceAll(clean(netns), "/", "_")
		}
		a.reset(down, answerByCommand)
		env := map[string]string{"CNI_COMMAND": cmd, "CNI_CONTAINERID": containerID, "CNI_NETNS": netns,
			"CNI_IFNAME": ifName, "CNI_ARGS": cniArgs, "CNI_PATH": "/opt/cni/bin"}
		e, printed := runPlugin(t, env, stdin)
		reqs := a.requests(t)
		queued, qerr := cniapi.QueuedDels(a.queue)
		if qerr != nil {
			t.Fatal(qerr)
		}

		var nc cniapi.NetConf
		if json.Unmarshal(stdin, &nc) != nil {
			if e == nil && forwarded[cmd] {
				t.Fatalf("%s with an unreadable configuration %q succeeded", cmd, stdin)
			}
			if len(reqs) > 0 || len(queued) > 0 || len(a.socks) > 0 {
				t.Fatalf("an unreadable configuration %q was forwarded: %d requests, %d queued", stdin, len(reqs), len(queued))
			}
			return
		}
		if !forwarded[cmd] {
			if len(reqs) > 0 || len(queued) > 0 {
				t.Fatalf("command %q is none the agent serves, yet it was forwarded", cmd)
			}
			return
		}
		wantSock := nc.AgentSocket
		if wantSock == "" {
			wantSock = cniapi.DefaultSocket
		}
		if len(a.socks) > 0 && a.socks[0] != wantSock {
			t.Fatalf("dialed %q, the configuration says %q", a.socks[0], wantSock)
		}
		if down {
			if len(reqs) > 0 {
				t.Fatal("a request reached an agent that is down")
			}
			if e == nil && (cmd != "DEL" || len(queued) != 1) {
				t.Fatalf("%s succeeded without the agent (%d DELs queued)", cmd, len(queued))
			}
			if e != nil && len(a.socks) > 0 && e.Code != types.ErrTryAgainLater {
				t.Fatalf("%s without the agent: %v, want try again later", cmd, e)
			}
			if len(queued) > 0 {
				wantDir := nc.DelQueueDir
				if wantDir == "" {
					wantDir = cniapi.DefaultDelQueueDir
				}
				if cmd != "DEL" || e != nil || len(a.queueDirs) != 1 || a.queueDirs[0] != wantDir {
					t.Fatalf("%s queued %d DELs (error %v) in %q, want %q", cmd, len(queued), e, a.queueDirs, wantDir)
				}
				checkForwarded(t, queued[0].Request, env, stdin)
			}
			return
		}
		if len(queued) > 0 {
			t.Fatal("a DEL was queued while the agent answers")
		}
		if e == nil && len(reqs) != 1 {
			t.Fatalf("%s succeeded after %d requests to the agent, want 1", cmd, len(reqs))
		}
		if len(reqs) == 0 {
			return
		}
		if len(reqs) > 1 {
			t.Fatalf("%d requests for one invocation", len(reqs))
		}
		checkForwarded(t, reqs[0], env, stdin)
		switch {
		case cmd == "CHECK":
			if e == nil || e.Code != 11 || e.Msg != "not there" || e.Details != "fake" {
				t.Fatalf("the agent's error came back as %v", e)
			}
		case e != nil:
			t.Fatalf("the agent answered %s with success, the plugin failed: %v", cmd, e)
		case cmd == "ADD" && !sameJSON(printed, []byte(addResult)):
			t.Fatalf("ADD printed %q, the agent's result is %s", printed, addResult)
		case cmd != "ADD" && len(printed) > 0:
			t.Fatalf("%s printed %q", cmd, printed)
		}
	})
}

// checkForwarded compares the request the plugin sent (or queued) with
// the invocation's environment and configuration.
func checkForwarded(t *testing.T, r cniapi.Request, env map[string]string, stdin []byte) {
	t.Helper()
	if r.Command != env["CNI_COMMAND"] {
		t.Fatalf("command %q forwarded as %q", env["CNI_COMMAND"], r.Command)
	}
	// JSON carries text: a value that is not UTF-8 arrives mended, which
	// a runtime never hands the plugin for these.
	for _, c := range []struct{ name, got string }{{"CNI_CONTAINERID", r.ContainerID}, {"CNI_NETNS", r.NetNS}, {"CNI_IFNAME", r.IfName}} {
		if want := env[c.name]; utf8.ValidString(want) && c.got != want {
			t.Fatalf("%s %q forwarded as %q", c.name, want, c.got)
		}
	}
	if args := env["CNI_ARGS"]; utf8.ValidString(args) {
		want := refArgs(args)
		if len(r.Args) != len(want) || (len(want) > 0 && !reflect.DeepEqual(r.Args, want)) {
			t.Fatalf("CNI_ARGS %q forwarded as %v, want %v", args, r.Args, want)
		}
	}
	if !sameJSON(r.Config, stdin) {
		t.Fatalf("configuration %q forwarded as %q", stdin, r.Config)
	}
}

// FuzzAgentAnswer has the agent answer arbitrary bytes. The plugin never
// panics and never reports success unless the answer is a CNI answer
// without an error (an ADD's with a result, which it prints as given); an
// answer with an error is returned as that CNI error; anything else is an
// internal error.
func FuzzAgentAnswer(f *testing.F) {
	a := startFakeAgent(f)
	for _, body := range []string{
		`{"result":` + addResult + `}`,
		`{}`, `null`, `{"result":null}`, `{"result":{}}`, `{"result":[1]}`, `{"result":"x"}`,
		`{"error":{"code":7,"msg":"bad","details":"d"}}`,
		`{"error":{"code":0,"msg":""}}`, `{"error":null,"result":{"ips":[]}}`, `{"error":{"code":-1}}`,
		`{"result":{"a":1}} junk`, ``, `not json`, `{"result":{"a":`, "404 page not found\n",
	} {
		for cmd := range uint8(3) {
			f.Add([]byte(body), cmd)
		}
	}
	stdin := []byte(`{"cniVersion":"1.1.0","name":"lace","type":"lace"}`)
	f.Fuzz(func(t *testing.T, body []byte, which uint8) {
		cmd := []string{"ADD", "DEL", "GC"}[int(which)%3]
		a.reset(false, func([]byte) []byte { return body })
		var out bytes.Buffer
		old := stdout
		stdout = &out
		err := call(cmd, &skel.CmdArgs{ContainerID: "c1", Netns: "/run/netns/x", IfName: "eth0", StdinData: stdin}, cmd == "ADD")
		stdout = old

		var ref cniapi.Response
		refErr := json.NewDecoder(bytes.NewReader(body)).Decode(&ref)
		var ce *types.Error
		switch {
		case refErr != nil:
			if !errors.As(err, &ce) || ce.Code != types.ErrInternal {
				t.Fatalf("answer %q is no CNI answer; the plugin returned %v", body, err)
			}
		case ref.Error != nil:
			if !errors.As(err, &ce) || ce.Code != ref.Error.Code || ce.Msg != ref.Error.Msg || ce.Details != ref.Error.Details {
				t.Fatalf("answer %q carries error %+v; the plugin returned %v", body, ref.Error, err)
			}
		case err != nil:
			var obj map[string]any
			if cmd != "ADD" || json.Unmarshal(ref.Result, &obj) == nil && obj != nil || !errors.As(err, &ce) || ce.Code != types.ErrInternal {
				t.Fatalf("%s answered %q failed: %v", cmd, body, err)
			}
		case cmd == "ADD":
			var obj map[string]any
			if json.Unmarshal(out.Bytes(), &obj) != nil || obj == nil || !sameJSON(out.Bytes(), ref.Result) {
				t.Fatalf("ADD answered %q succeeded printing %q: a CNI result is an object", body, out.Bytes())
			}
		}
		if err != nil && out.Len() > 0 {
			t.Fatalf("the plugin failed (%v) and printed %q", err, out.Bytes())
		}
		if cmd != "ADD" && out.Len() > 0 {
			t.Fatalf("%s printed %q", cmd, out.Bytes())
		}
	})
}
