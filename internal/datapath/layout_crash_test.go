package datapath

import (
	"errors"
	"log/slog"
	"testing"

	"github.com/cilium/ebpf"
)

func crashSpecs(t *testing.T) []*ebpf.CollectionSpec {
	t.Helper()
	pod, err := loadPod()
	if err != nil {
		t.Fatal(err)
	}
	und, err := loadUnderlay()
	if err != nil {
		t.Fatal(err)
	}
	sock, err := loadSock()
	if err != nil {
		t.Fatal(err)
	}
	l2, err := loadL2()
	if err != nil {
		t.Fatal(err)
	}
	return []*ebpf.CollectionSpec{pod, und, sock, l2}
}

// bumpCt makes lace_ct's layout one version newer, the conversion
// flipping Pad (so converting twice shows).
func bumpCt() func() {
	return BumpLayoutForTest("lace_ct", func(k, v []byte) ([]byte, []byte, bool) {
		out := append([]byte(nil), v...)
		out[34] ^= 0xff
		return k, out, true
	})
}

// A crash after the migration and before the programs load (and the old
// recordLayouts): the restarted agent must not convert the converted map
// again. Before, versions were recorded only after every program loaded.
func TestMigrationNotTwiceAfterCrash(t *testing.T) {
	pin := tempPinDir(t)
	d := loadSized(t, pin, MapSizes{})
	f := ctEntry(1)
	if err := d.pod.LaceCt.Put(f.k, f.v); err != nil {
		t.Fatal(err)
	}
	d.Close()
	defer bumpCt()()
	// First agent: migrates, then dies before loading its programs.
	if _, err := reconcileLayouts(pin, crashSpecs(t), true, slog.Default()); err != nil {
		t.Fatal(err)
	}
	up := loadSized(t, pin, MapSizes{}) // the restarted agent
	var v podCtVal
	if err := up.pod.LaceCt.Lookup(f.k, &v); err != nil {
		t.Fatal(err)
	}
	want := f.v
	want.Pad ^= 0xff
	if v != want {
		t.Errorf("flow converted twice (or not): %+v, want %+v (replaced %v)", v, want, up.ReplacedMaps())
	}
}

// A crash between a migration's record and its rename: the restarted
// agent finishes the switch (the converted map takes the pin), or converts
// the old map once; never twice, never the old entries unconverted.
func TestMigrationCrashBeforeRename(t *testing.T) {
	pin := tempPinDir(t)
	d := loadSized(t, pin, MapSizes{})
	f := ctEntry(2)
	if err := d.pod.LaceCt.Put(f.k, f.v); err != nil {
		t.Fatal(err)
	}
	d.Close()
	defer bumpCt()()
	crash := errors.New("crash")
	afterMigrationRecordForTest = func(name string) error {
		if name == "lace_ct" {
			return crash
		}
		return nil
	}
	_, err := reconcileLayouts(pin, crashSpecs(t), true, slog.Default())
	afterMigrationRecordForTest = nil
	if !errors.Is(err, crash) {
		t.Fatalf("reconcile: %v, want the crash", err)
	}
	up := loadSized(t, pin, MapSizes{})
	var v podCtVal
	if err := up.pod.LaceCt.Lookup(f.k, &v); err != nil {
		t.Fatal(err)
	}
	want := f.v
	want.Pad ^= 0xff
	if v != want {
		t.Errorf("flow after the crash: %+v, want converted once %+v", v, want)
	}
	// And a third start changes nothing.
	up.Close()
	again := loadSized(t, pin, MapSizes{})
	if len(again.ReplacedMaps()) != 0 {
		t.Errorf("third start replaced %v", again.ReplacedMaps())
	}
	if err := again.pod.LaceCt.Lookup(f.k, &v); err != nil || v != want {
		t.Errorf("third start: %+v %v", v, err)
	}
}
