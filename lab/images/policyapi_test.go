package images

import (
	"archive/tar"
	"path/filepath"
	"reflect"
	"testing"
)

func TestPolicyAPIAgnhostImage(t *testing.T) {
	img, err := PolicyAPIAgnhostImage([]byte("fake agnhost"), []byte("fake busybox"), []byte("static bash"),
		[]string{"bin/sh", "bin/bash", "usr/bin/nc"})
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), PolicyAPIAgnhostTar)
	if err := WriteTarball(p, PolicyAPIAgnhostRef, img); err != nil {
		t.Fatal(err)
	}
	_, files := readBack(t, p, PolicyAPIAgnhostRef)
	// The servers run /bin/bash -c: the static bash, even over a busybox
	// applet of that name.
	for f, want := range map[string]string{"bin/bash": "static bash", "agnhost": "fake agnhost", "bin/busybox": "fake busybox"} {
		if e := files[f]; e.typ != tar.TypeReg || e.data != want {
			t.Errorf("%s: %+v, want %q", f, e, want)
		}
	}
	if e := files["bin/sh"]; e.typ != tar.TypeSymlink || e.link != "/bin/busybox" {
		t.Errorf("bin/sh: %+v, want busybox", e)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	// The client containers name no command: agnhost pause.
	if c := cf.Config; !reflect.DeepEqual(c.Entrypoint, []string{"/agnhost"}) || !reflect.DeepEqual(c.Cmd, []string{"pause"}) {
		t.Errorf("config: entrypoint %q cmd %q", c.Entrypoint, c.Cmd)
	}
}
