package netutil

import (
	"os/exec"
	"path/filepath"
	"testing"
)

// TestKeptNSFollowsItsPath: the kept handle answers for the namespace its
// path names now, also after the namespace is made again at that path (a
// node's namespace recreated), and not for the one it first opened.
func TestKeptNSFollowsItsPath(t *testing.T) {
	name := testNS(t, "lkept")
	path := filepath.Join(NetNSDir, name)
	k := NewKeptNS(path)
	defer k.Close()
	link := func() (found bool) {
		t.Helper()
		if err := k.Do(func(n *NS) error {
			_, _, err := n.Link("lkept0")
			found = err == nil
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return found
	}
	if link() {
		t.Fatal("a new namespace has lkept0")
	}
	if out, err := exec.Command("ip", "-n", name, "link", "add", "lkept0", "type", "bridge").CombinedOutput(); err != nil {
		t.Fatalf("add a link: %v: %s", err, out)
	}
	if !link() {
		t.Fatal("the kept handle does not see the link added in its namespace")
	}
	if err := DeleteNamed(name); err != nil {
		t.Fatal(err)
	}
	if err := k.Do(func(*NS) error { return nil }); err == nil {
		t.Fatal("a deleted namespace's path still answers")
	}
	if err := CreateNamed(name); err != nil {
		t.Fatal(err)
	}
	if link() {
		t.Fatal("the kept handle answers for the namespace deleted, not for the one now at its path")
	}
}
