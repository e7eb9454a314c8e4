// Command coredns is CoreDNS v1.12.1 with only the plugins the lab's
// Corefile (kubeadm's, lab/dns.go) uses, linked the way CoreDNS's
// plugin.cfg is meant to be trimmed: upstream's main is coredns.go, which
// blank-imports core/plugin (every plugin, cloud SDKs included); this main
// imports coremain and the plugins below instead. The directive order stays
// upstream's (dnsserver.Directives): a directive whose plugin is not linked
// is simply never set up, and a Corefile naming one fails to parse
// ("unknown directive") rather than running without it.
//
// kubeadm 1.34's Corefile: errors, health, ready, kubernetes, prometheus,
// forward, cache, loop, reload, loadbalance. The lab leaves forward out of
// its Corefile (nothing outside answers) but it is linked so that kubeadm's
// own Corefile runs too. hosts and log are the plugins of the Corefile the
// upstream DNS specs give the test name server they run from agnhost's
// image (/coredns there is this binary).
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/hosts"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics" // the prometheus directive
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

func main() {
	coremain.Run()
}
