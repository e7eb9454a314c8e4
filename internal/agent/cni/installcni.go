package cni

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/lace-cni/lace/internal/fsutil"
	"github.com/lace-cni/lace/pkg/cniapi"
)

// Names of what install-cni writes on the node.
const (
	// CNIPluginName is the plugin's file name in the CNI bin dir and its
	// "type" in the network configuration.
	CNIPluginName = "lace"
	// CNIConfName is the conflist in the CNI conf dir; "10-" sorts it
	// before the runtime's usual fallbacks.
	CNIConfName = "10-lace.conflist"
	// CNINetworkName is the conflist's network name.
	CNINetworkName = "lace"
)

// InstallCNIOptions configure InstallCNI.
type InstallCNIOptions struct {
	// Binary is the lace-cni binary to install (the image's own).
	Binary string
	// BinDir is the runtime's CNI bin dir (a hostPath in the DaemonSet).
	BinDir string
	// ConfDir is the runtime's CNI conf dir.
	ConfDir string
	// AgentSocket is where lace-cni reaches the agent, written into the
	// configuration.
	AgentSocket string
}

// DefaultInstallCNIOptions are the flag defaults of `lace-agent install-cni`.
func DefaultInstallCNIOptions() InstallCNIOptions {
	return InstallCNIOptions{
		Binary:      "/usr/bin/lace-cni",
		BinDir:      "/opt/cni/bin",
		ConfDir:     "/etc/cni/net.d",
		AgentSocket: cniapi.DefaultSocket,
	}
}

// InstallCNI puts the lace plugin and its configuration on the node: the
// binary as <BinDir>/lace and the conflist as <ConfDir>/10-lace.conflist.
// Both are replaced atomically (temp file in the same directory, fsync,
// rename), so the runtime never runs a half-written plugin or reads a
// half-written config; running it again overwrites both, which is how an
// upgraded image replaces the plugin. The directories are created when
// missing.
func InstallCNI(o InstallCNIOptions) error {
	src, err := os.Open(o.Binary)
	if err != nil {
		return fmt.Errorf("open cni binary: %w", err)
	}
	defer src.Close()
	if err := os.MkdirAll(o.BinDir, 0o755); err != nil {
		return fmt.Errorf("create cni bin dir: %w", err)
	}
	if err := fsutil.WriteAtomic(filepath.Join(o.BinDir, CNIPluginName), 0o755, func(w io.Writer) error {
		_, err := io.Copy(w, src)
		return err
	}); err != nil {
		return fmt.Errorf("install cni binary: %w", err)
	}
	conf, err := CNIConfList(o.AgentSocket)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(o.ConfDir, 0o755); err != nil {
		return fmt.Errorf("create cni conf dir: %w", err)
	}
	if err := fsutil.WriteAtomic(filepath.Join(o.ConfDir, CNIConfName), 0o644, func(w io.Writer) error {
		_, err := w.Write(conf)
		return err
	}); err != nil {
		return fmt.Errorf("install cni config: %w", err)
	}
	return nil
}

// CNIConfList is the network configuration list that makes the runtime run
// lace-cni against the agent at socket.
func CNIConfList(socket string) ([]byte, error) {
	// In a list, cniVersion and name belong to the list, not the plugin
	// (cniapi.NetConf is what the plugin receives, with both filled in).
	type plugin struct {
		Type        string `json:"type"`
		AgentSocket string `json:"agentSocket"`
	}
	// Runtimes whose libcni knows CNI 1.1 (GC, STATUS) read cniVersions
	// and pick its highest version they support; older ones (containerd
	// 1.6 and 1.7) read only cniVersion and refuse a result newer than
	// they know, so that stays 1.0.0.
	conf := struct {
		CNIVersion  string   `json:"cniVersion"`
		CNIVersions []string `json:"cniVersions"`
		Name        string   `json:"name"`
		Plugins     []plugin `json:"plugins"`
	}{
		CNIVersion:  "1.0.0",
		CNIVersions: []string{"1.0.0", "1.1.0"},
		Name:        CNINetworkName,
		Plugins:     []plugin{{Type: CNIPluginName, AgentSocket: socket}},
	}
	b, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode cni config: %w", err)
	}
	return append(b, '\n'), nil
}
