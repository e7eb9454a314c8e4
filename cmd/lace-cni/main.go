// Command lace-cni is Lace's CNI plugin: a thin client that forwards each
// CNI invocation to lace-agent over its unix socket and returns the agent's
// result or error. It keeps no state and touches nothing itself, except
// that a DEL the agent cannot be reached for is queued on the node
// (cniapi.QueueDel) for the agent to replay.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/lace-cni/lace/pkg/cniapi"
)

const about = "Lace CNI plugin (forwards to lace-agent)"

var (
	cniFuncs = skel.CNIFuncs{
		Add:    func(a *skel.CmdArgs) error { return call("ADD", a, true) },
		Del:    func(a *skel.CmdArgs) error { return call("DEL", a, false) },
		Check:  func(a *skel.CmdArgs) error { return call("CHECK", a, false) },
		Status: func(a *skel.CmdArgs) error { return call("STATUS", a, false) },
		GC:     func(a *skel.CmdArgs) error { return call("GC", a, false) },
	}
	pluginVersions = version.PluginSupports("0.4.0", "1.0.0", "1.1.0")
)

// The agent's socket, the node's DEL queue and the result's destination
// are variables so that the tests, which feed the plugin arbitrary
// configurations, reach neither a real agent nor the node's queue.
var (
	dialAgent = func(ctx context.Context, sock string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}
	queueDel           = cniapi.QueueDel
	stdout   io.Writer = os.Stdout
)

func main() {
	skel.PluginMainFuncs(cniFuncs, pluginVersions, about)
}

func call(cmd string, a *skel.CmdArgs, printResult bool) error {
	var conf cniapi.NetConf
	if err := json.Unmarshal(a.StdinData, &conf); err != nil {
		return types.NewError(types.ErrDecodingFailure, "parse network config", err.Error())
	}
	sock := conf.AgentSocket
	if sock == "" {
		sock = cniapi.DefaultSocket
	}
	req := cniapi.Request{Command: cmd, ContainerID: a.ContainerID, NetNS: a.Netns, IfName: a.IfName, PluginPID: os.Getpid(),
		Args: parseArgs(a.Args), Config: a.StdinData}
	body, _ := json.Marshal(req)
	client := &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return dialAgent(ctx, sock) }}}
	resp, err := client.Post("http://lace-agent/cni", "application/json", bytes.NewReader(body))
	if err != nil {
		if cmd == "DEL" {
			// Nothing can be removed without the agent, and a DEL that
			// fails blocks the pod's deletion for as long as the agent is
			// down. It is queued durably on the node instead and the agent
			// replays it when it is back; only a DEL that cannot even be
			// queued fails (the runtime retries it).
			dir := conf.DelQueueDir
			if dir == "" {
				dir = cniapi.DefaultDelQueueDir
			}
			if qerr := queueDel(dir, req); qerr != nil {
				return types.NewError(types.ErrTryAgainLater, "lace-agent is not reachable at "+sock+" and the DEL cannot be queued",
					fmt.Sprintf("%v; queue %s: %v", err, dir, qerr))
			}
			return nil
		}
		return types.NewError(types.ErrTryAgainLater, "lace-agent is not reachable at "+sock, err.Error())
	}
	defer resp.Body.Close()
	var out cniapi.Response
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return types.NewError(types.ErrInternal, "decode lace-agent answer", err.Error())
	}
	if out.Error != nil {
		return &types.Error{Code: out.Error.Code, Msg: out.Error.Msg, Details: out.Error.Details}
	}
	if printResult {
		// The runtime reads the printed result as the pod's network: an
		// ADD that succeeds with no result, or with one that is no JSON
		// object, would leave it without addresses and no error to show.
		if !bytes.HasPrefix(bytes.TrimSpace(out.Result), []byte("{")) {
			return types.NewError(types.ErrInternal, "lace-agent answered "+cmd+" with no result", string(out.Result))
		}
		if _, err := stdout.Write(out.Result); err != nil {
			return fmt.Errorf("write result: %w", err)
		}
	}
	return nil
}

func parseArgs(s string) map[string]string {
	out := map[string]string{}
	for _, kv := range strings.Split(s, ";") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			out[k] = v
		}
	}
	return out
}
