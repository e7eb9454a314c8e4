package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// The patch: what this kernel (no SCTP) keeps of the suite, derived from
// the pinned module's own files at build time. Nothing of upstream is
// committed; this program rewrites a copy of the module cache's files.
//
//   - base manifests: every container whose environment names a
//     SERVE_SCTP_PORT_ (agnhost porter serving SCTP) is removed: it cannot
//     listen without SCTP, so its pod would never be Ready and the suite's
//     setup would fail for every test;
//   - tests of the standard profile whose every probe (kubernetes.PokeServer)
//     is SCTP are skipped through the suite's own SkipTests option
//     (suite.Options.SkipTests, set in TestConformance);
//   - in the other tests of the standard profile, each SCTP probe statement
//     is commented out in place (line numbers unchanged, so failures point
//     at upstream's file:line); every TCP and UDP probe is kept.
//
// Tests outside the standard profile (the experimental features) are left
// as they are: they skip themselves in TestConformance.

// sctpEnv marks a container serving SCTP in the base manifests.
const sctpEnv = "SERVE_SCTP_PORT_"

// probeCommentPrefix starts every line of a removed probe.
const probeCommentPrefix = "// lace (no SCTP in this kernel): "

// Deviation is what the patch changed; the runner prints it with the
// results.
type Deviation struct {
	Module            string             `json:"module"` // path@version
	StandardFeatures  []string           `json:"standardFeatures"`
	RemovedContainers []RemovedContainer `json:"removedContainers"`
	// SkippedTests are the standard-profile tests whose every probe is
	// SCTP, skipped through SkipTests.
	SkippedTests []string `json:"skippedTests"`
	// Probes counts, per standard-profile test, its probes by protocol as
	// upstream has them; RemovedProbes those commented out.
	Probes        map[string]map[string]int `json:"probes"`
	RemovedProbes map[string]int            `json:"removedProbes"`
	// Experimental are the tests outside the standard profile (untouched).
	Experimental []string `json:"experimental"`
}

// RemovedContainer is one container the manifests lost.
type RemovedContainer struct {
	File, Object, Container string
}

// TotalRemovedProbes sums RemovedProbes.
func (d Deviation) TotalRemovedProbes() int {
	n := 0
	for _, c := range d.RemovedProbes {
		n += c
	}
	return n
}

// String says the deviation in a few lines.
func (d Deviation) String() string {
	var b strings.Builder
	hostNet := 0
	objects := map[string]bool{}
	for _, c := range d.RemovedContainers {
		objects[c.Object] = true
		if strings.Contains(c.Container, "{{") {
			hostNet++
		}
	}
	fmt.Fprintf(&b, "deviation from %s (this kernel has no SCTP):\n", d.Module)
	fmt.Fprintf(&b, "  base manifests: %d SCTP server containers removed (%d objects; %d of them on host ports of the host-network set)\n",
		len(d.RemovedContainers), len(objects), hostNet)
	fmt.Fprintf(&b, "  skipped through SkipTests (every probe SCTP): %s\n", strings.Join(d.SkippedTests, ", "))
	var names []string
	for n := range d.RemovedProbes {
		names = append(names, n)
	}
	sort.Strings(names)
	var parts []string
	for _, n := range names {
		p := d.Probes[n]
		parts = append(parts, fmt.Sprintf("%s %d (kept tcp %d, udp %d)", n, d.RemovedProbes[n], p["tcp"], p["udp"]))
	}
	fmt.Fprintf(&b, "  SCTP probes removed: %d: %s\n", d.TotalRemovedProbes(), strings.Join(parts, ", "))
	return b.String()
}

// Patch copies the module at modDir into out/src, patches the copy, writes
// the build module (toolsDir's go.mod with a replace of the module by
// ./src, and its go.sum) and out/deviation.json.
func Patch(modDir, toolsDir, out string) (Deviation, error) {
	d := Deviation{Probes: map[string]map[string]int{}, RemovedProbes: map[string]int{}}
	gomod, err := os.ReadFile(filepath.Join(modDir, "go.mod"))
	if err != nil {
		return d, err
	}
	modPath := modulePath(gomod)
	_, version, ok := strings.Cut(filepath.Base(modDir), "@")
	if modPath == "" || !ok {
		return d, fmt.Errorf("%s: not a module cache directory (path@version)", modDir)
	}
	d.Module = modPath + "@" + version
	src := filepath.Join(out, "src")
	if err := os.RemoveAll(out); err != nil {
		return d, err
	}
	if err := copyTree(modDir, src); err != nil {
		return d, err
	}
	conf := filepath.Join(src, "conformance")

	// The standard profile's features.
	b, err := os.ReadFile(filepath.Join(conf, "utils", "suite", "features.go"))
	if err != nil {
		return d, err
	}
	if d.StandardFeatures, err = StandardFeatures(b); err != nil {
		return d, fmt.Errorf("utils/suite/features.go: %w", err)
	}

	// Base manifests.
	err = filepath.WalkDir(filepath.Join(conf, "base"), func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() || !strings.HasSuffix(p, ".yaml") {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(conf, p)
		nb, removed := RemoveSCTPContainers(b)
		if len(removed) == 0 {
			return nil
		}
		for i := range removed {
			removed[i].File = filepath.ToSlash(rel)
		}
		d.RemovedContainers = append(d.RemovedContainers, removed...)
		if bytes.Contains(nb, []byte(sctpEnv)) {
			return fmt.Errorf("%s: %s left after the patch", rel, sctpEnv)
		}
		return os.WriteFile(p, nb, 0o644)
	})
	if err != nil {
		return d, err
	}
	if len(d.RemovedContainers) == 0 {
		return d, errors.New("no SCTP server container found in the base manifests: has the suite changed?")
	}

	// Tests.
	files, err := filepath.Glob(filepath.Join(conf, "tests", "*.go"))
	if err != nil {
		return d, err
	}
	sort.Strings(files)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return d, err
		}
		nb, tests, err := PatchTests(b, d.StandardFeatures)
		if err != nil {
			return d, fmt.Errorf("%s: %w", filepath.Base(f), err)
		}
		for _, t := range tests {
			switch {
			case !t.Standard:
				d.Experimental = append(d.Experimental, t.Name)
			case t.SCTPOnly:
				d.SkippedTests = append(d.SkippedTests, t.Name)
				d.Probes[t.Name] = t.Probes
			default:
				d.Probes[t.Name] = t.Probes
				if t.Removed > 0 {
					d.RemovedProbes[t.Name] = t.Removed
				}
			}
		}
		if !bytes.Equal(nb, b) {
			if err := os.WriteFile(f, nb, 0o644); err != nil {
				return d, err
			}
		}
	}
	sort.Strings(d.SkippedTests)
	sort.Strings(d.Experimental)
	if len(d.Probes) == 0 {
		return d, errors.New("no test of the standard profile found")
	}

	// TestConformance: the skips.
	tf := filepath.Join(conf, "conformance_test.go")
	b, err = os.ReadFile(tf)
	if err != nil {
		return d, err
	}
	nb, err := AddSkipTests(b, "laceSkipTests")
	if err != nil {
		return d, fmt.Errorf("conformance_test.go: %w", err)
	}
	if err := os.WriteFile(tf, nb, 0o644); err != nil {
		return d, err
	}
	if err := os.WriteFile(filepath.Join(conf, "lace_skiptests_test.go"), SkipTestsFile(d.SkippedTests), 0o644); err != nil {
		return d, err
	}

	// The build module.
	tmod, err := os.ReadFile(filepath.Join(toolsDir, "go.mod"))
	if err != nil {
		return d, err
	}
	tmod = append(tmod, fmt.Sprintf("\n// The pinned module, patched by lab/conformance/policyapi.\nreplace %s => ./src\n", modPath)...)
	if err := os.WriteFile(filepath.Join(out, "go.mod"), tmod, 0o644); err != nil {
		return d, err
	}
	sum, err := os.ReadFile(filepath.Join(toolsDir, "go.sum"))
	if err != nil {
		return d, err
	}
	if err := os.WriteFile(filepath.Join(out, "go.sum"), sum, 0o644); err != nil {
		return d, err
	}
	j, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return d, err
	}
	return d, os.WriteFile(filepath.Join(out, "deviation.json"), append(j, '\n'), 0o644)
}

func modulePath(gomod []byte) string {
	for _, l := range strings.Split(string(gomod), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "module" {
			return strings.Trim(f[1], `"`)
		}
	}
	return ""
}

// copyTree copies the regular files of from into to, writable (the module
// cache's are read-only).
func copyTree(from, to string) error {
	return filepath.WalkDir(from, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, p)
		dst := filepath.Join(to, rel)
		if e.IsDir() {
			return os.MkdirAll(dst, 0o755)
		}
		if !e.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(dst, b, 0o644)
	})
}

var (
	itemRE = regexp.MustCompile(`^(\s*)- name:\s*(.*?)\s*$`)
	keyRE  = regexp.MustCompile(`^(\s*)containers:\s*$`)
	metaRE = regexp.MustCompile(`^  name:\s*(.*?)\s*$`)
)

func indent(l string) int { return len(l) - len(strings.TrimLeft(l, " ")) }

// RemoveSCTPContainers removes from a (templated) manifest every item of a
// containers: list whose lines name sctpEnv, working on lines (the
// suite's templates are not YAML before they are executed). An item is its
// `- name:` line and the lines indented deeper below it.
func RemoveSCTPContainers(b []byte) ([]byte, []RemovedContainer) {
	lines := strings.SplitAfter(string(b), "\n")
	var out []string
	var removed []RemovedContainer
	object := ""
	listIndent := -1 // indent of the current containers: key
	for i := 0; i < len(lines); {
		l := lines[i]
		trim := strings.TrimRight(l, "\n")
		if strings.HasPrefix(trim, "---") {
			object, listIndent = "", -1
		}
		if m := metaRE.FindStringSubmatch(trim); m != nil && object == "" {
			object = m[1]
		}
		if m := keyRE.FindStringSubmatch(trim); m != nil {
			listIndent = len(m[1])
		} else if strings.TrimSpace(trim) != "" && listIndent >= 0 && indent(trim) <= listIndent && !strings.HasPrefix(strings.TrimSpace(trim), "- ") {
			listIndent = -1
		}
		m := itemRE.FindStringSubmatch(trim)
		if m == nil || listIndent < 0 || len(m[1]) < listIndent {
			out = append(out, l)
			i++
			continue
		}
		// An item of the containers list: find its end.
		j := i + 1
		for j < len(lines) {
			t := strings.TrimRight(lines[j], "\n")
			if strings.TrimSpace(t) != "" && indent(t) <= len(m[1]) {
				break
			}
			j++
		}
		for j > i+1 && strings.TrimSpace(lines[j-1]) == "" {
			j-- // blank lines after the item are not its own
		}
		item := strings.Join(lines[i:j], "")
		if strings.Contains(item, sctpEnv) {
			removed = append(removed, RemovedContainer{Object: object, Container: m[2]})
		} else {
			out = append(out, lines[i:j]...)
		}
		i = j
	}
	return []byte(strings.Join(out, "")), removed
}

// StandardFeatures reads the features of `var StandardFeatures =
// sets.New(...)` in the suite's features.go.
func StandardFeatures(src []byte) ([]string, error) {
	f, err := parser.ParseFile(token.NewFileSet(), "features.go", src, 0)
	if err != nil {
		return nil, err
	}
	var out []string
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok || len(vs.Names) != 1 || vs.Names[0].Name != "StandardFeatures" || len(vs.Values) != 1 {
			return true
		}
		if call, ok := vs.Values[0].(*ast.CallExpr); ok {
			for _, a := range call.Args {
				if id, ok := a.(*ast.Ident); ok {
					out = append(out, id.Name)
				}
			}
		}
		return false
	})
	if len(out) == 0 {
		return nil, errors.New("no StandardFeatures")
	}
	return out, nil
}

// TestInfo is one suite.ConformanceTest of a tests file.
type TestInfo struct {
	Name     string
	Standard bool           // every feature is a standard one
	Probes   map[string]int // PokeServer calls by protocol
	SCTPOnly bool           // every probe is SCTP
	Removed  int            // SCTP probes commented out
}

// PatchTests finds the suite.ConformanceTest literals of a tests file and,
// for those of the standard profile (every feature in standard) that mix
// SCTP probes with others, comments out each SCTP probe statement.
func PatchTests(src []byte, standard []string) ([]byte, []TestInfo, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "tests.go", src, parser.ParseComments)
	if err != nil {
		return nil, nil, err
	}
	std := map[string]bool{}
	for _, s := range standard {
		std[s] = true
	}
	lines := strings.SplitAfter(string(src), "\n")
	var tests []TestInfo
	var failed error
	ast.Inspect(f, func(n ast.Node) bool {
		cl, ok := n.(*ast.CompositeLit)
		if !ok || !isSel(cl.Type, "suite", "ConformanceTest") {
			return true
		}
		ti := TestInfo{Standard: true, Probes: map[string]int{}}
		var body *ast.FuncLit
		for _, e := range cl.Elts {
			kv, ok := e.(*ast.KeyValueExpr)
			if !ok {
				continue
			}
			key, _ := kv.Key.(*ast.Ident)
			if key == nil {
				continue
			}
			switch key.Name {
			case "ShortName":
				if bl, ok := kv.Value.(*ast.BasicLit); ok {
					ti.Name, _ = strconv.Unquote(bl.Value)
				}
			case "Features":
				fl, ok := kv.Value.(*ast.CompositeLit)
				if !ok {
					failed = fmt.Errorf("test at %s: Features is no literal", fset.Position(kv.Pos()))
					return false
				}
				for _, fe := range fl.Elts {
					s, ok := fe.(*ast.SelectorExpr)
					if !ok || !std[s.Sel.Name] {
						ti.Standard = false
					}
				}
			case "Test":
				body, _ = kv.Value.(*ast.FuncLit)
			}
		}
		if ti.Name == "" || body == nil {
			failed = fmt.Errorf("test at %s: no ShortName or Test", fset.Position(cl.Pos()))
			return false
		}
		// The probes, and the statements of the SCTP ones.
		var sctp []ast.Stmt
		ast.Inspect(body, func(n ast.Node) bool {
			if failed != nil {
				return false
			}
			var call *ast.CallExpr
			es, isStmt := n.(*ast.ExprStmt)
			if isStmt {
				call, _ = es.X.(*ast.CallExpr)
			} else {
				call, _ = n.(*ast.CallExpr)
			}
			if call == nil || !isSel(call.Fun, "kubernetes", "PokeServer") {
				return true
			}
			if len(call.Args) < 6 {
				failed = fmt.Errorf("%s: PokeServer with %d arguments", fset.Position(call.Pos()), len(call.Args))
				return false
			}
			bl, ok := call.Args[5].(*ast.BasicLit)
			if !ok || bl.Kind != token.STRING {
				failed = fmt.Errorf("%s: PokeServer's protocol is no literal", fset.Position(call.Pos()))
				return false
			}
			proto, _ := strconv.Unquote(bl.Value)
			proto = strings.ToLower(proto)
			ti.Probes[proto]++
			if proto == "sctp" {
				if !isStmt {
					failed = fmt.Errorf("%s: an SCTP probe that is no statement of its own", fset.Position(call.Pos()))
					return false
				}
				sctp = append(sctp, es)
			}
			return false
		})
		if failed != nil {
			return false
		}
		total := 0
		for _, c := range ti.Probes {
			total += c
		}
		ti.SCTPOnly = total > 0 && ti.Probes["sctp"] == total
		if ti.Standard && !ti.SCTPOnly {
			for _, s := range sctp {
				for ln := fset.Position(s.Pos()).Line; ln <= fset.Position(s.End()).Line; ln++ {
					l := lines[ln-1]
					ind := len(l) - len(strings.TrimLeft(l, "\t "))
					lines[ln-1] = l[:ind] + probeCommentPrefix + l[ind:]
				}
				ti.Removed++
			}
		}
		tests = append(tests, ti)
		return false
	})
	if failed != nil {
		return nil, nil, failed
	}
	out := []byte(strings.Join(lines, ""))
	if _, err := parser.ParseFile(token.NewFileSet(), "patched.go", out, 0); err != nil {
		return nil, nil, fmt.Errorf("patched: %w", err)
	}
	return out, tests, nil
}

func isSel(e ast.Expr, x, sel string) bool {
	s, ok := e.(*ast.SelectorExpr)
	if !ok || s.Sel.Name != sel {
		return false
	}
	id, ok := s.X.(*ast.Ident)
	return ok && id.Name == x
}

// AddSkipTests sets SkipTests: varName in the suite.Options literal of
// TestConformance, on the line of its closing brace (no line moves).
func AddSkipTests(src []byte, varName string) ([]byte, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "conformance_test.go", src, 0)
	if err != nil {
		return nil, err
	}
	at := -1
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Name.Name != "TestConformance" || fd.Body == nil {
			continue
		}
		ast.Inspect(fd.Body, func(n ast.Node) bool {
			cl, ok := n.(*ast.CompositeLit)
			if !ok || !isSel(cl.Type, "suite", "Options") {
				return true
			}
			for _, e := range cl.Elts {
				if kv, ok := e.(*ast.KeyValueExpr); ok {
					if id, ok := kv.Key.(*ast.Ident); ok && id.Name == "SkipTests" {
						err = errors.New("TestConformance sets SkipTests already")
					}
				}
			}
			if at >= 0 {
				err = errors.New("two suite.Options literals in TestConformance")
			}
			at = fset.Position(cl.Rbrace).Offset
			return false
		})
	}
	if err != nil {
		return nil, err
	}
	if at < 0 {
		return nil, errors.New("no suite.Options literal in TestConformance")
	}
	out := append([]byte{}, src[:at]...)
	out = append(out, "SkipTests: "+varName+", "...)
	out = append(out, src[at:]...)
	if _, err := parser.ParseFile(token.NewFileSet(), "patched.go", out, 0); err != nil {
		return nil, fmt.Errorf("patched: %w", err)
	}
	return out, nil
}

// SkipTestsFile is the file the patch adds beside conformance_test.go.
func SkipTestsFile(skip []string) []byte {
	var b bytes.Buffer
	b.WriteString("// Code generated by lab/conformance/policyapi (Lace). DO NOT EDIT.\n\n")
	b.WriteString("package conformance_test\n\n")
	b.WriteString("// laceSkipTests are the tests of the standard profile whose every probe\n")
	b.WriteString("// is SCTP, which the kernel Lace's lab runs on does not have; TestConformance\n")
	b.WriteString("// passes them to the suite's SkipTests option.\n")
	b.WriteString("var laceSkipTests = []string{\n")
	for _, s := range skip {
		fmt.Fprintf(&b, "\t%q,\n", s)
	}
	b.WriteString("}\n")
	return b.Bytes()
}
