package helm

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// The chart tests run the pinned helm (make helm; the Makefile exports
// LACE_HELM). Without it they skip, except in CI, where a skipped chart
// test would hide a broken chart.

const testNamespace = "lace-system"

func helmBin(t *testing.T) string {
	t.Helper()
	h := os.Getenv("LACE_HELM")
	if h != "" {
		if _, err := os.Stat(h); err == nil {
			return h
		}
	}
	msg := fmt.Sprintf("no helm at LACE_HELM=%q: run 'make helm' (or the tests through make)", h)
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// chartDir writes the embedded chart, so the tests check what the lab
// installs.
func chartDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "lace")
	if err := WriteChart(dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

func runHelm(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	h := helmBin(t)
	cmd := exec.Command(h, args...)
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home+"/cache", "HELM_CONFIG_HOME="+home+"/config",
		"HELM_DATA_HOME="+home+"/data")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	return out, nil
}

// rendered is the output of helm template, by kind and name.
type rendered struct {
	docs []map[string]any
}

func (r rendered) kinds(kind string) []map[string]any {
	var out []map[string]any
	for _, d := range r.docs {
		if d["kind"] == kind {
			out = append(out, d)
		}
	}
	return out
}

func (r rendered) names(kind string) []string {
	var out []string
	for _, d := range r.kinds(kind) {
		out = append(out, name(d))
	}
	slices.Sort(out)
	return out
}

func name(d map[string]any) string {
	md, _ := d["metadata"].(map[string]any)
	n, _ := md["name"].(string)
	return n
}

// get decodes the object kind/name into out (a typed API object).
func (r rendered) get(t *testing.T, kind, objName string, out any) {
	t.Helper()
	for _, d := range r.kinds(kind) {
		if name(d) != objName {
			continue
		}
		b, err := yaml.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.UnmarshalStrict(b, out); err != nil {
			t.Fatalf("decode %s %s: %v", kind, objName, err)
		}
		return
	}
	t.Fatalf("no %s %s rendered; have %v", kind, objName, r.names(kind))
}

func template(t *testing.T, set ...string) (rendered, error) {
	t.Helper()
	args := []string{"template", "lace", chartDir(t), "--namespace", testNamespace, "--include-crds"}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	out, err := runHelm(t, args...)
	if err != nil {
		return rendered{}, err
	}
	var r rendered
	for _, doc := range splitYAML(out) {
		var m map[string]any
		// Strict: a duplicated key (two labels of one name) fails here,
		// as the API server would refuse it.
		if err := yaml.UnmarshalStrict(doc, &m); err != nil {
			return rendered{}, fmt.Errorf("decode rendered document: %w\n%s", err, doc)
		}
		if m != nil {
			r.docs = append(r.docs, m)
		}
	}
	return r, nil
}

func mustTemplate(t *testing.T, set ...string) rendered {
	t.Helper()
	r, err := template(t, set...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func splitYAML(b []byte) [][]byte {
	var docs [][]byte
	var cur []byte
	for line := range bytes.Lines(b) {
		if bytes.Equal(bytes.TrimRight(line, "\n"), []byte("---")) {
			docs = append(docs, cur)
			cur = nil
			continue
		}
		cur = append(cur, line...)
	}
	return append(docs, cur)
}

func TestLint(t *testing.T) {
	for _, set := range [][]string{nil, {"apiServer.host=172.30.0.1", "apiServer.port=6443"}} {
		args := []string{"lint", "--strict", chartDir(t), "--namespace", testNamespace}
		for _, s := range set {
			args = append(args, "--set", s)
		}
		if out, err := runHelm(t, args...); err != nil {
			t.Errorf("%v\n%s", err, out)
		}
	}
}

func TestAgentDaemonSet(t *testing.T) {
	r := mustTemplate(t)
	var ds appsv1.DaemonSet
	r.get(t, "DaemonSet", "lace-agent", &ds)
	if ds.Namespace != testNamespace {
		t.Errorf("namespace %q, want the release namespace %q", ds.Namespace, testNamespace)
	}
	p := ds.Spec.Template.Spec
	if !p.HostNetwork || !p.HostPID {
		t.Errorf("hostNetwork %v hostPID %v, want both", p.HostNetwork, p.HostPID)
	}
	if p.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
		t.Errorf("dnsPolicy %q", p.DNSPolicy)
	}
	if p.PriorityClassName != "system-node-critical" {
		t.Errorf("priorityClassName %q", p.PriorityClassName)
	}
	if len(p.Tolerations) != 1 || p.Tolerations[0] != (corev1.Toleration{Operator: corev1.TolerationOpExists}) {
		t.Errorf("tolerations %+v, want only {operator: Exists}", p.Tolerations)
	}
	us := ds.Spec.UpdateStrategy
	if us.Type != appsv1.RollingUpdateDaemonSetStrategyType || us.RollingUpdate == nil ||
		us.RollingUpdate.MaxUnavailable == nil || us.RollingUpdate.MaxUnavailable.IntValue() != 1 {
		t.Errorf("updateStrategy %+v, want RollingUpdate maxUnavailable 1", us)
	}
	if p.ServiceAccountName != "lace-agent" {
		t.Errorf("serviceAccountName %q", p.ServiceAccountName)
	}

	if len(p.InitContainers) != 1 || p.InitContainers[0].Name != "install-cni" {
		t.Fatalf("init containers %+v, want install-cni", p.InitContainers)
	}
	ic := p.InitContainers[0]
	if sc := ic.SecurityContext; sc == nil || sc.Privileged == nil || *sc.Privileged {
		t.Errorf("install-cni must be explicitly unprivileged: %+v", sc)
	}
	wantArgs := []string{"install-cni", "--cni-bin-dir=/host/opt/cni/bin", "--cni-conf-dir=/host/etc/cni/net.d",
		"--agent-socket=/run/lace/cni.sock"}
	if got := append(slices.Clone(ic.Command), ic.Args...); !slices.Equal(got, append([]string{"/usr/bin/lace-agent"}, wantArgs...)) {
		t.Errorf("install-cni runs %q", got)
	}
	hostPaths := map[string]string{}
	for _, v := range p.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	for _, m := range ic.VolumeMounts {
		want := map[string]string{"/host/opt/cni/bin": "/opt/cni/bin", "/host/etc/cni/net.d": "/etc/cni/net.d"}[m.MountPath]
		if want == "" || hostPaths[m.Name] != want {
			t.Errorf("install-cni mounts %s from host %q", m.MountPath, hostPaths[m.Name])
		}
	}
	if len(ic.VolumeMounts) != 2 {
		t.Errorf("install-cni mounts %d volumes, want only the two CNI dirs", len(ic.VolumeMounts))
	}

	if len(p.Containers) != 1 {
		t.Fatalf("%d containers", len(p.Containers))
	}
	c := p.Containers[0]
	if c.Image != "ghcr.io/lace-cni/lace:dev" || c.ImagePullPolicy != corev1.PullIfNotPresent {
		t.Errorf("image %q pull %q", c.Image, c.ImagePullPolicy)
	}
	if sc := c.SecurityContext; sc == nil || sc.Privileged == nil || !*sc.Privileged {
		t.Errorf("agent must be privileged: %+v", sc)
	}
	for _, a := range []string{"--health-probe-bind-address=:9879", "--metrics-bind-address=:9962",
		"--cni-socket=/run/lace/cni.sock", "--bpffs=/sys/fs/bpf/lace", "--state-dir=/var/lib/lace", "--log-level=info",
		"--map-services=65536", "--map-backends=262144", "--map-conntrack=131072", "--map-fragments=8192", "--service-max-frontends=8192", "--service-max-backends=65536"} {
		if !slices.Contains(c.Args, a) {
			t.Errorf("agent args %q lack %s", c.Args, a)
		}
	}
	if !hasEnvFromField(c.Env, "NODE_NAME", "spec.nodeName") {
		t.Errorf("agent env %+v lacks NODE_NAME from spec.nodeName", c.Env)
	}
	checkProbes(t, "agent", c, 9879)
	for _, want := range []struct{ mount, host string }{{"/sys/fs/bpf", "/sys/fs/bpf"}, {"/run/lace", "/run/lace"},
		{"/var/lib/lace", "/var/lib/lace"}} {
		i := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == want.mount })
		if i < 0 || hostPaths[c.VolumeMounts[i].Name] != want.host {
			t.Errorf("agent does not mount host %s at %s", want.host, want.mount)
		}
	}
}

func hasEnvFromField(env []corev1.EnvVar, name, field string) bool {
	return slices.ContainsFunc(env, func(e corev1.EnvVar) bool {
		return e.Name == name && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == field
	})
}

// checkProbes: liveness /healthz and readiness /readyz, on the port the
// binary serves health on.
func checkProbes(t *testing.T, what string, c corev1.Container, port int) {
	t.Helper()
	portOf := func(p *corev1.Probe) int {
		if p.HTTPGet.Port.IntValue() != 0 {
			return p.HTTPGet.Port.IntValue()
		}
		for _, cp := range c.Ports {
			if cp.Name == p.HTTPGet.Port.String() {
				return int(cp.ContainerPort)
			}
		}
		return -1
	}
	for _, pr := range []struct {
		probe *corev1.Probe
		path  string
	}{{c.LivenessProbe, "/healthz"}, {c.ReadinessProbe, "/readyz"}} {
		if pr.probe == nil || pr.probe.HTTPGet == nil {
			t.Errorf("%s: no httpGet probe for %s", what, pr.path)
			continue
		}
		if pr.probe.HTTPGet.Path != pr.path || portOf(pr.probe) != port {
			t.Errorf("%s: probe %s on port %d, want %s on %d", what, pr.probe.HTTPGet.Path, portOf(pr.probe), pr.path, port)
		}
	}
	if !slices.Contains(c.Args, fmt.Sprintf("--health-probe-bind-address=:%d", port)) {
		t.Errorf("%s: probes on %d but args %q", what, port, c.Args)
	}
}

func TestControllerDeployment(t *testing.T) {
	r := mustTemplate(t, "controller.blockReleaseGrace=5s")
	var d appsv1.Deployment
	r.get(t, "Deployment", "lace-controller", &d)
	p := d.Spec.Template.Spec
	if !p.HostNetwork {
		t.Error("controller is not host-network")
	}
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 1 {
		t.Errorf("replicas %v", d.Spec.Replicas)
	}
	if p.PriorityClassName != "system-cluster-critical" {
		t.Errorf("priorityClassName %q", p.PriorityClassName)
	}
	for _, key := range []string{"node-role.kubernetes.io/control-plane", "node.kubernetes.io/not-ready"} {
		if !slices.ContainsFunc(p.Tolerations, func(tl corev1.Toleration) bool {
			return tl.Key == key && tl.Effect == corev1.TaintEffectNoSchedule
		}) {
			t.Errorf("controller does not tolerate %s:NoSchedule: %+v", key, p.Tolerations)
		}
	}
	c := p.Containers[0]
	for _, a := range []string{"--leader-elect=true", "--leader-election-namespace=" + testNamespace,
		"--metrics-bind-address=:9963", "--block-release-grace=5s"} {
		if !slices.Contains(c.Args, a) {
			t.Errorf("controller args %q lack %s", c.Args, a)
		}
	}
	checkProbes(t, "controller", c, 9881)

	var pdb policyv1.PodDisruptionBudget
	r.get(t, "PodDisruptionBudget", "lace-controller", &pdb)
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 || pdb.Namespace != testNamespace {
		t.Errorf("PDB %+v", pdb.Spec)
	}
	if pdb.Spec.Selector == nil || !subset(pdb.Spec.Selector.MatchLabels, d.Spec.Template.Labels) {
		t.Errorf("PDB selector %v does not select the controller pods %v", pdb.Spec.Selector, d.Spec.Template.Labels)
	}

	// Host-network ports of the two components must not collide.
	var ds appsv1.DaemonSet
	r.get(t, "DaemonSet", "lace-agent", &ds)
	seen := map[int32]string{}
	for _, ct := range []corev1.Container{ds.Spec.Template.Spec.Containers[0], c} {
		for _, cp := range ct.Ports {
			if other, ok := seen[cp.ContainerPort]; ok {
				t.Errorf("port %d used by %s and %s", cp.ContainerPort, other, ct.Name)
			}
			seen[cp.ContainerPort] = ct.Name
		}
	}
}

func subset(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return len(sel) > 0
}

func TestMetricsServices(t *testing.T) {
	r := mustTemplate(t)
	for _, tc := range []struct {
		svc, kind, workload string
		port                int32
	}{{"lace-agent-metrics", "DaemonSet", "lace-agent", 9962}, {"lace-controller-metrics", "Deployment", "lace-controller", 9963}} {
		var s corev1.Service
		r.get(t, "Service", tc.svc, &s)
		if s.Spec.ClusterIP != corev1.ClusterIPNone || len(s.Spec.Ports) != 1 || s.Spec.Ports[0].Port != tc.port {
			t.Errorf("%s: clusterIP %q ports %+v, want headless on %d", tc.svc, s.Spec.ClusterIP, s.Spec.Ports, tc.port)
		}
		if s.Annotations["prometheus.io/scrape"] != "true" || s.Annotations["prometheus.io/port"] != fmt.Sprint(tc.port) {
			t.Errorf("%s: annotations %v", tc.svc, s.Annotations)
		}
		var tmpl corev1.PodTemplateSpec
		if tc.kind == "DaemonSet" {
			var ds appsv1.DaemonSet
			r.get(t, tc.kind, tc.workload, &ds)
			tmpl = ds.Spec.Template
		} else {
			var d appsv1.Deployment
			r.get(t, tc.kind, tc.workload, &d)
			tmpl = d.Spec.Template
		}
		if !subset(s.Spec.Selector, tmpl.Labels) {
			t.Errorf("%s selects %v, not the %s pods %v", tc.svc, s.Spec.Selector, tc.workload, tmpl.Labels)
		}
	}
}

func TestRBACLeastPrivilege(t *testing.T) {
	r := mustTemplate(t)
	type role struct {
		kind, name, namespace string
		rules                 []rbacv1.PolicyRule
	}
	var roles []role
	for _, kind := range []string{"ClusterRole", "Role"} {
		for _, n := range r.names(kind) {
			var cr rbacv1.ClusterRole
			r.get(t, kind, n, &cr)
			roles = append(roles, role{kind, n, cr.Namespace, cr.Rules})
		}
	}
	// The agents write Leases (their heartbeats) only in a namespace of
	// their own: never where leader elections live.
	for _, ro := range roles {
		for _, rule := range ro.rules {
			if ro.name == "lace-agent" && slices.Contains(rule.Resources, "leases") &&
				(ro.kind != "Role" || ro.namespace != "lace-heartbeats") {
				t.Errorf("the agent's Lease rights are in %s %s/%s, want only a Role in lace-heartbeats", ro.kind, ro.namespace, ro.name)
			}
		}
	}
	if len(roles) < 3 {
		t.Fatalf("roles %+v, want a ClusterRole per component and the controller's Role", roles)
	}
	can := map[string]bool{}
	for _, ro := range roles {
		for _, rule := range ro.rules {
			for _, field := range [][]string{rule.Verbs, rule.Resources, rule.APIGroups} {
				if slices.Contains(field, "*") {
					t.Errorf("%s %s has a wildcard: %+v", ro.kind, ro.name, rule)
				}
			}
			if len(rule.NonResourceURLs) > 0 {
				t.Errorf("%s %s grants non-resource URLs %v", ro.kind, ro.name, rule.NonResourceURLs)
			}
			for _, g := range rule.APIGroups {
				for _, res := range rule.Resources {
					for _, v := range rule.Verbs {
						can[fmt.Sprintf("%s %s %s/%s", ro.name, v, g, res)] = true
					}
				}
			}
		}
	}
	// What the code does (internal/agent, internal/controller); a rule
	// lost here fails at runtime only.
	for _, want := range []string{
		"lace-agent watch /pods", "lace-agent get /namespaces", "lace-agent create /events",
		"lace-agent list lace-cni.io/networkbindingpolicies", "lace-agent patch lace-cni.io/underlayendpoints",
		"lace-agent patch lace-cni.io/underlayendpoints/status", "lace-agent create lace-cni.io/networkendpoints",
		"lace-agent delete lace-cni.io/networkendpoints",
		"lace-agent update coordination.k8s.io/leases", "lace-agent watch lace-cni.io/loadbalancerclasses",
		"lace-controller update lace-cni.io/networks/status", "lace-controller create lace-cni.io/allocations",
		"lace-controller delete lace-cni.io/underlayendpoints", "lace-controller update lace-cni.io/networkbindingpolicies/status",
		"lace-controller update coordination.k8s.io/leases", "lace-controller create /events",
		"lace-controller create lace-cni.io/neighbors", "lace-controller delete lace-cni.io/fdbentries",
		"lace-controller patch lace-cni.io/networkendpoints/status", "lace-controller patch lace-cni.io/fdbentries",
		"lace-controller patch lace-cni.io/neighbors", "lace-controller watch k8s.cni.cncf.io/ipamclaims",
		"lace-controller patch k8s.cni.cncf.io/ipamclaims/status", "lace-agent get k8s.cni.cncf.io/ipamclaims",
		"lace-agent watch networking.k8s.io/networkpolicies", "lace-agent list /namespaces",
		"lace-agent watch policy.networking.k8s.io/clusternetworkpolicies",
	} {
		if !can[want] {
			t.Errorf("RBAC lacks %q", want)
		}
	}
	// The agents never claim l2 addresses or MACs: the controller alone does.
	for _, deny := range []string{"lace-agent update lace-cni.io/networks", "lace-agent delete /pods",
		"lace-agent create lace-cni.io/neighbors", "lace-agent create lace-cni.io/fdbentries",
		"lace-agent patch lace-cni.io/networkendpoints/status", "lace-agent patch k8s.cni.cncf.io/ipamclaims/status",
		"lace-agent list k8s.cni.cncf.io/ipamclaims",
		"lace-controller get /secrets"} {
		if can[deny] {
			t.Errorf("RBAC grants %q", deny)
		}
	}
	// Leader election is namespaced: the Lease rule lives in a Role.
	var lr rbacv1.Role
	r.get(t, "Role", "lace-controller", &lr)
	if lr.Namespace != testNamespace {
		t.Errorf("leader election Role in %q, want %q", lr.Namespace, testNamespace)
	}
	for _, n := range []string{"lace-agent", "lace-controller"} {
		var b rbacv1.ClusterRoleBinding
		r.get(t, "ClusterRoleBinding", n, &b)
		if b.RoleRef.Name != n || len(b.Subjects) != 1 || b.Subjects[0].Name != n || b.Subjects[0].Namespace != testNamespace {
			t.Errorf("ClusterRoleBinding %s: %+v %+v", n, b.RoleRef, b.Subjects)
		}
	}
}

func TestCRDsAreConfigCRD(t *testing.T) {
	want := crdFiles(t, "../../config/crd")
	got := crdFiles(t, "lace/crds")
	if !slices.Equal(keys(got), keys(want)) {
		t.Fatalf("chart crds/ %v, config/crd %v: run 'make generate'", keys(got), keys(want))
	}
	for n, b := range want {
		if !bytes.Equal(got[n], b) {
			t.Errorf("crds/%s differs from config/crd/%s: run 'make generate'", n, n)
		}
	}

	r := mustTemplate(t)
	if n := len(r.kinds("CustomResourceDefinition")); n != len(want) {
		t.Errorf("chart installs %d CRDs, config/crd has %d", n, len(want))
	}
}

func crdFiles(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no CRDs in %s: %v", dir, err)
	}
	out := map[string][]byte{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		out[filepath.Base(p)] = b
	}
	return out
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func TestDefaultObjects(t *testing.T) {
	r := mustTemplate(t)
	nets := map[string]*unstructured.Unstructured{}
	for _, d := range r.kinds("Network") {
		u := &unstructured.Unstructured{Object: d}
		nets[u.GetName()] = u
	}
	def, world := nets["default"], nets["world"]
	if def == nil || world == nil {
		t.Fatalf("networks %v, want default and world", r.names("Network"))
	}
	str := func(u *unstructured.Unstructured, path ...string) string {
		s, _, _ := unstructured.NestedString(u.Object, path...)
		return s
	}
	num := func(u *unstructured.Unstructured, path ...string) int64 {
		v, _, _ := unstructured.NestedFieldNoCopy(u.Object, path...)
		switch n := v.(type) {
		case float64:
			return int64(n)
		case int64:
			return n
		}
		return -1
	}
	if str(def, "spec", "type") != "l3" || str(def, "spec", "ipv4Subnet", "prefix") != "10.244.0.0/16" ||
		num(def, "spec", "ipv4Subnet", "hostLocalPrefixLength") != 24 ||
		str(def, "spec", "ipv6Subnet", "prefix") != "fd00:244::/56" || num(def, "spec", "ipv6Subnet", "hostLocalPrefixLength") != 64 {
		t.Errorf("default network spec %v", def.Object["spec"])
	}
	prefixes, _, _ := unstructured.NestedStringSlice(world.Object, "spec", "externalPrefixes")
	if str(world, "spec", "type") != "external" || !slices.Equal(prefixes, []string{"0.0.0.0/0", "::/0"}) {
		t.Errorf("world network spec %v", world.Object["spec"])
	}
	for n, u := range nets {
		if u.GetLabels()["lace-cni.io/network"] != n {
			t.Errorf("network %s labels %v, want lace-cni.io/network=%s", n, u.GetLabels(), n)
		}
		if u.GetAnnotations()["helm.sh/resource-policy"] != "" {
			t.Errorf("network %s survives uninstall", n)
		}
	}

	nbps := r.kinds("NetworkBindingPolicy")
	if len(nbps) != 1 {
		t.Fatalf("binding policies %v", r.names("NetworkBindingPolicy"))
	}
	nbp := &unstructured.Unstructured{Object: nbps[0]}
	if nbp.GetName() != "default" || str(nbp, "spec", "network") != "default" || num(nbp, "spec", "priority") != 2147483647 {
		t.Errorf("catch-all binding policy %s %v", nbp.GetName(), nbp.Object["spec"])
	}

	// Each routing policy's selectors select exactly the intended networks.
	got := map[string]bool{}
	for _, d := range r.kinds("NetworkRoutingPolicy") {
		u := &unstructured.Unstructured{Object: d}
		src := selected(t, u, "srcSelector", nets)
		dst := selected(t, u, "destSelector", nets)
		if len(src) != 1 || len(dst) != 1 {
			t.Errorf("routing policy %s selects %v -> %v, want one network each side", u.GetName(), src, dst)
			continue
		}
		got[src[0]+"->"+dst[0]] = true
	}
	if len(got) != 2 || !got["default->world"] || !got["world->default"] {
		t.Errorf("routing policies %v, want default->world and world->default", got)
	}
}

// selected lists the networks whose labels match the policy's selector
// (matchLabels only, which is what the chart writes).
func selected(t *testing.T, u *unstructured.Unstructured, field string, nets map[string]*unstructured.Unstructured) []string {
	t.Helper()
	ml, ok, _ := unstructured.NestedStringMap(u.Object, "spec", field, "matchLabels")
	if !ok || len(ml) == 0 {
		t.Errorf("%s: %s has no matchLabels", u.GetName(), field)
		return nil
	}
	var out []string
	for n, nw := range nets {
		if subset(ml, nw.GetLabels()) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

func TestDefaultObjectsCanBeDisabled(t *testing.T) {
	for _, tc := range []struct {
		set                  string
		networks, nbps, nrps []string
	}{
		{"defaults.enabled=false", nil, nil, nil},
		{"defaults.world.enabled=false", []string{"default"}, []string{"default"}, nil},
		{"defaults.network.enabled=false", []string{"world"}, []string{"default"}, nil},
		{"defaults.bindingPolicy.enabled=false", []string{"default", "world"}, nil, []string{"default-to-world", "world-to-default"}},
		{"defaults.routingPolicies.enabled=false", []string{"default", "world"}, []string{"default"}, nil},
	} {
		t.Run(tc.set, func(t *testing.T) {
			r := mustTemplate(t, tc.set)
			for _, k := range []struct {
				kind string
				want []string
			}{{"Network", tc.networks}, {"NetworkBindingPolicy", tc.nbps}, {"NetworkRoutingPolicy", tc.nrps}} {
				if got := r.names(k.kind); !slices.Equal(got, k.want) {
					t.Errorf("%s: %v, want %v", k.kind, got, k.want)
				}
			}
		})
	}
}

func TestAPIServerEnv(t *testing.T) {
	envOf := func(r rendered) map[string]map[string]string {
		var ds appsv1.DaemonSet
		var d appsv1.Deployment
		r.get(t, "DaemonSet", "lace-agent", &ds)
		r.get(t, "Deployment", "lace-controller", &d)
		out := map[string]map[string]string{}
		for name, c := range map[string]corev1.Container{"agent": ds.Spec.Template.Spec.Containers[0],
			"controller": d.Spec.Template.Spec.Containers[0]} {
			out[name] = map[string]string{}
			for _, e := range c.Env {
				out[name][e.Name] = e.Value
			}
		}
		return out
	}
	for comp, env := range envOf(mustTemplate(t)) {
		if _, ok := env["KUBERNETES_SERVICE_HOST"]; ok {
			t.Errorf("%s sets KUBERNETES_SERVICE_HOST without apiServer.host", comp)
		}
	}
	for comp, env := range envOf(mustTemplate(t, "apiServer.host=172.30.0.1", "apiServer.port=6443")) {
		if env["KUBERNETES_SERVICE_HOST"] != "172.30.0.1" || env["KUBERNETES_SERVICE_PORT"] != "6443" {
			t.Errorf("%s env %v, want the API server 172.30.0.1:6443", comp, env)
		}
	}
	if _, err := template(t, "apiServer.host=172.30.0.1"); err == nil || !strings.Contains(err.Error(), "apiServer.port") {
		t.Errorf("apiServer.host without a port: err = %v, want a failure naming apiServer.port", err)
	}
}

func TestSchemaRejectsBadValues(t *testing.T) {
	for _, tc := range []struct{ set, path string }{
		{"apiServer.port=x", "/apiServer/port"},
		{"agent.healthPort=abc", "/agent/healthPort"},
		{"controller.replicas=-1", "/controller/replicas"},
		{"defaults.enabled=maybe", "/defaults/enabled"},
		{"image.pullPolicy=Sometimes", "/image/pullPolicy"},
		{"unknownKey=1", "unknownKey"},
		{"agent.typo=1", "typo"},
		{"services.externalIPs.allowedCIDRs={8.8.8.8}", "/services/externalIPs/allowedCIDRs/0"},
	} {
		_, err := template(t, tc.set)
		if err == nil || !strings.Contains(err.Error(), "schema") || !strings.Contains(err.Error(), tc.path) {
			t.Errorf("--set %s: err = %v, want a schema failure at %s", tc.set, err, tc.path)
		}
	}
}

// TestExternalIPAllowListCanonical: an IPv4 CIDR with host bits set
// fails the install with a clear message (it would be read as its whole
// network); canonical ones of any length pass.
func TestExternalIPAllowListCanonical(t *testing.T) {
	for _, bad := range []string{"192.0.2.5/16", "198.51.100.1/24", "198.51.100.8/28", "10.0.0.1/31"} {
		_, err := template(t, "services.externalIPs.allowedCIDRs={"+bad+"}")
		if err == nil || !strings.Contains(err.Error(), bad+" has host bits set") {
			t.Errorf("%s: err = %v, want a host bits failure", bad, err)
		}
	}
	mustTemplate(t, "services.externalIPs.allowedCIDRs={198.51.100.16/28,192.0.2.5/32,10.0.0.0/8,0.0.0.0/0,2001:db8::/64}")
}

// TestExternalIPAllowList: the agent and the controller get the same
// allow-list of external IPs, empty by default (every one refused).
func TestExternalIPAllowList(t *testing.T) {
	for _, tc := range []struct{ set, want string }{
		{"", "--allowed-external-ips="},
		{"services.externalIPs.allowedCIDRs={198.51.100.0/28,2001:db8::/120}", "--allowed-external-ips=198.51.100.0/28,2001:db8::/120"},
	} {
		var sets []string
		if tc.set != "" {
			sets = append(sets, tc.set)
		}
		r := mustTemplate(t, sets...)
		var d appsv1.Deployment
		r.get(t, "Deployment", "lace-controller", &d)
		var ds appsv1.DaemonSet
		r.get(t, "DaemonSet", "lace-agent", &ds)
		for what, args := range map[string][]string{"controller": d.Spec.Template.Spec.Containers[0].Args,
			"agent": ds.Spec.Template.Spec.Containers[0].Args} {
			if !slices.Contains(args, tc.want) {
				t.Errorf("--set %q: %s args %q lack %s", tc.set, what, args, tc.want)
			}
		}
	}
}

func TestWriteChart(t *testing.T) {
	dir := chartDir(t)
	for _, f := range []string{"Chart.yaml", "values.yaml", "values.schema.json", ".helmignore",
		"templates/_helpers.tpl", "templates/NOTES.txt", "crds/lace-cni.io_networks.yaml"} {
		want, err := os.ReadFile(filepath.Join("lace", f))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("written %s differs from the tree's (%v)", f, err)
		}
	}
}

// TestControllerPlacement: the controller's token rules Lace, so by
// default it runs on control-plane nodes when the cluster has them (auto
// looks them up; `helm template` sees no cluster and renders the
// preference), and controlPlane requires them.
func TestControllerPlacement(t *testing.T) {
	cpTerm := func(a *corev1.Affinity) (required, preferred bool) {
		if a == nil || a.NodeAffinity == nil {
			return false, false
		}
		is := func(r corev1.NodeSelectorRequirement) bool {
			return r.Key == "node-role.kubernetes.io/control-plane" && r.Operator == corev1.NodeSelectorOpExists
		}
		if rq := a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution; rq != nil {
			for _, term := range rq.NodeSelectorTerms {
				required = required || slices.ContainsFunc(term.MatchExpressions, is)
			}
		}
		for _, p := range a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
			preferred = preferred || slices.ContainsFunc(p.Preference.MatchExpressions, is)
		}
		return required, preferred
	}
	for _, c := range []struct {
		set                 []string
		required, preferred bool
	}{
		{nil, false, true},
		{[]string{"controller.placement=auto"}, false, true},
		{[]string{"controller.placement=any"}, false, true},
		{[]string{"controller.placement=controlPlane"}, true, false},
		{[]string{"controller.placement=controlPlane", "controller.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight=1",
			"controller.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].preference.matchExpressions[0].key=pool",
			"controller.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].preference.matchExpressions[0].operator=Exists"}, false, false},
	} {
		var d appsv1.Deployment
		mustTemplate(t, c.set...).get(t, "Deployment", "lace-controller", &d)
		req, pref := cpTerm(d.Spec.Template.Spec.Affinity)
		if req != c.required || pref != c.preferred {
			t.Errorf("%v: control-plane required %v preferred %v, want %v %v", c.set, req, pref, c.required, c.preferred)
		}
		if a := d.Spec.Template.Spec.Affinity; a == nil || a.PodAntiAffinity == nil {
			t.Errorf("%v: no pod anti-affinity", c.set)
		}
	}
	if _, err := template(t, "controller.placement=workers"); err == nil {
		t.Error("controller.placement=workers accepted")
	}
}
