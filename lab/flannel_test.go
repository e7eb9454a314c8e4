package lab

import (
	"encoding/json"
	"strings"
	"testing"
)

// The pods of a flannel lab get what flannel's CNI plugin would give them
// from flanneld's subnet file: the node's range (not the gateway's host
// address flanneld writes), the vxlan MTU, a route to the cluster's range,
// and no masquerade by the bridge when flanneld masquerades.
func TestFlannelCNIConfig(t *testing.T) {
	env := "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.2.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n"
	b, err := flannelCNIConfig([]byte(env))
	if err != nil {
		t.Fatal(err)
	}
	var conf struct {
		Plugins []struct {
			Type, Bridge string
			IsGateway    bool `json:"isGateway"`
			IPMasq       bool `json:"ipMasq"`
			MTU          int  `json:"mtu"`
			IPAM         struct {
				Ranges [][]struct{ Subnet string }
				Routes []struct{ Dst string }
			}
		}
	}
	if err := json.Unmarshal(b, &conf); err != nil {
		t.Fatal(err)
	}
	if len(conf.Plugins) != 1 {
		t.Fatalf("plugins %s", b)
	}
	p := conf.Plugins[0]
	if p.Type != "bridge" || !p.IsGateway || p.IPMasq || p.MTU != 1450 ||
		len(p.IPAM.Ranges) != 1 || len(p.IPAM.Ranges[0]) != 1 || p.IPAM.Ranges[0][0].Subnet != "10.244.2.0/24" ||
		len(p.IPAM.Routes) != 1 || p.IPAM.Routes[0].Dst != "10.244.0.0/16" {
		t.Errorf("config for %q:\n%s", env, b)
	}
	for _, bad := range []string{
		strings.Replace(env, "FLANNEL_MTU=1450", "FLANNEL_MTU=", 1),
		strings.Replace(env, "FLANNEL_SUBNET=10.244.2.1/24", "", 1),
	} {
		if b, err := flannelCNIConfig([]byte(bad)); err == nil {
			t.Errorf("subnet file %q: config %s, want an error", bad, b)
		}
	}
}
