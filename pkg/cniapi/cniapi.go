// Package cniapi is the wire format between lace-cni (run by the container
// runtime) and lace-agent: one JSON request per CNI invocation over the
// agent's unix socket, answered by a CNI result or a CNI error.
package cniapi

import "encoding/json"

// DefaultSocket is where the agent listens unless told otherwise.
const DefaultSocket = "/run/lace/cni.sock"

// MaxRequestBytes bounds one request the agent reads from its socket. A
// CNI request is the network configuration, the arguments and, for GC,
// the list of valid attachments (about a hundred bytes per pod): tens of
// kilobytes on a full node. Anything far past that is refused before it
// is buffered, so no caller can make the agent hold an unbounded body.
const MaxRequestBytes = 1 << 20

// Request carries one CNI invocation.
type Request struct {
	Command     string `json:"command"` // ADD, DEL, CHECK, STATUS, GC
	ContainerID string `json:"containerID,omitempty"`
	NetNS       string `json:"netns,omitempty"`
	// PluginPID is the calling plugin's PID: the agent resolves NetNS
	// through /proc/<pid>/root, in the runtime's mount namespace.
	PluginPID int               `json:"pluginPID,omitempty"`
	IfName    string            `json:"ifName,omitempty"`
	Args      map[string]string `json:"args,omitempty"` // CNI_ARGS
	// Config is the network configuration from stdin, as given.
	Config json.RawMessage `json:"config,omitempty"`
}

// Response is a CNI result (ADD), nothing (DEL, CHECK, STATUS, GC), or an
// error in the CNI error format.
type Response struct {
	Result json.RawMessage `json:"result,omitempty"`
	Error  *Error          `json:"error,omitempty"`
}

// Error is a CNI error: code, message and details.
type Error struct {
	Code    uint   `json:"code"`
	Msg     string `json:"msg"`
	Details string `json:"details,omitempty"`
}

// NetConf is Lace's part of the CNI network configuration.
type NetConf struct {
	CNIVersion  string `json:"cniVersion"`
	Name        string `json:"name"`
	Type        string `json:"type"`
	AgentSocket string `json:"agentSocket,omitempty"`
	// DelQueueDir is where lace-cni queues a DEL it cannot deliver
	// (DefaultDelQueueDir when empty).
	DelQueueDir string `json:"delQueueDir,omitempty"`
}
