package cni

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lace-cni/lace/internal/fsutil"
	"github.com/lace-cni/lace/internal/podnet"
)

// TestCheckpointGroupCommit: endpoints recorded at once (a burst of ADDs)
// share writes of the checkpoint instead of queueing one whole-file write
// each, and every one is on disk when its put returns. So do address
// reservations, made one at a time under a lock (as addLock) and waited
// for outside it: a put under the lock wrote once per ADD, one after
// another.
func TestCheckpointGroupCommit(t *testing.T) {
	var addLock sync.Mutex
	for _, tc := range []struct {
		name   string
		record func(c *checkpoint, e Endpoint) error
	}{
		{"puts", (*checkpoint).put},
		{"reservations", func(c *checkpoint, e Endpoint) error {
			addLock.Lock()
			wait := c.reserve(e)
			addLock.Unlock()
			return wait()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			c, err := loadCheckpoint(dir)
			if err != nil {
				t.Fatal(err)
			}
			var writes atomic.Int32
			c.write = func(path string, mode os.FileMode, fill func(io.Writer) error) error {
				writes.Add(1)
				time.Sleep(5 * time.Millisecond) // a disk's fsyncs
				return fsutil.WriteAtomic(path, mode, fill)
			}
			const n = 64
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					id := fmt.Sprintf("c%02d", i)
					if err := tc.record(c, Endpoint{ContainerID: id}); err != nil {
						t.Error(err)
						return
					}
					// Returned: a fresh load of the file holds it.
					back, err := loadCheckpoint(dir)
					if err != nil {
						t.Error(err)
						return
					}
					if _, ok := back.get(id); !ok {
						t.Errorf("%s returned before a write held it", id)
					}
				})
			}
			wg.Wait()
			if w := writes.Load(); w >= n/4 {
				t.Errorf("%d %s at once took %d writes, want fewer than %d", n, tc.name, w, n/4)
			}
			t.Logf("%d %s at once: %d writes", n, tc.name, writes.Load())
			if got := len(c.all()); got != n {
				t.Errorf("%d endpoints recorded, want %d", got, n)
			}
		})
	}
}

// TestCheckpointFailedWrite: a write that fails fails the put whose write
// it was; a put waiting on it writes its own change and succeeds.
func TestCheckpointFailedWrite(t *testing.T) {
	dir := t.TempDir()
	c, err := loadCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	inFirst := make(chan struct{})
	release := make(chan struct{})
	var calls atomic.Int32
	c.write = func(path string, mode os.FileMode, fill func(io.Writer) error) error {
		if calls.Add(1) == 1 {
			close(inFirst)
			<-release
			return errors.New("disk full")
		}
		return fsutil.WriteAtomic(path, mode, fill)
	}
	first := make(chan error, 1)
	go func() { first <- c.put(Endpoint{ContainerID: "a"}) }()
	<-inFirst
	second := make(chan error, 1)
	go func() { second <- c.put(Endpoint{ContainerID: "b"}) }()
	// b waits on a's write (its change counted), which then fails.
	for {
		c.mu.Lock()
		waiting := c.changed == 2
		c.mu.Unlock()
		if waiting {
			break
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	if err := <-first; err == nil {
		t.Error("the put whose write failed returned no error")
	}
	if err := <-second; err != nil {
		t.Errorf("the put waiting on a failed write: %v, want its own write", err)
	}
	back, err := loadCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := back.get("b"); !ok {
		t.Error("b is not on disk")
	}
}

// TestCheckpointReadWaitsForWrite: a lookup made while a change is being
// written answers once the write is done, so a retried DEL cannot report
// success for a removal that would not survive a crash.
func TestCheckpointReadWaitsForWrite(t *testing.T) {
	dir := t.TempDir()
	c, err := loadCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.put(Endpoint{ContainerID: "a"}); err != nil {
		t.Fatal(err)
	}
	inWrite := make(chan struct{})
	release := make(chan struct{})
	var written atomic.Bool
	c.write = func(path string, mode os.FileMode, fill func(io.Writer) error) error {
		close(inWrite)
		<-release
		err := fsutil.WriteAtomic(path, mode, fill)
		written.Store(true)
		return err
	}
	removed := make(chan error, 1)
	go func() { removed <- c.remove(podnet.HostIfName("a")) }()
	<-inWrite
	type answer struct{ found, afterWrite bool }
	looked := make(chan answer, 1)
	go func() {
		_, ok := c.get("a")
		looked <- answer{found: ok, afterWrite: written.Load()}
	}()
	select {
	case <-looked:
		t.Fatal("a lookup answered while the removal was being written")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	if err := <-removed; err != nil {
		t.Fatal(err)
	}
	if a := <-looked; a.found || !a.afterWrite {
		t.Errorf("the lookup during the removal's write: found %t, answered after the write %t; want false, true", a.found, a.afterWrite)
	}
}

// gatedCheckpoint is a checkpoint in a temporary directory whose writes
// each announce themselves on inWrite and wait for a value on release
// (channels of the given buffers); writes counts those that ended.
func gatedCheckpoint(t *testing.T, inBuf, releaseBuf int) (c *checkpoint, writes *atomic.Int32, inWrite, release chan struct{}) {
	t.Helper()
	c, err := loadCheckpoint(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	writes = new(atomic.Int32)
	inWrite, release = make(chan struct{}, inBuf), make(chan struct{}, releaseBuf)
	c.write = func(path string, mode os.FileMode, fill func(io.Writer) error) error {
		inWrite <- struct{}{}
		<-release
		writes.Add(1)
		return fsutil.WriteAtomic(path, mode, fill)
	}
	return c, writes, inWrite, release
}

// TestCheckpointReadWaitsForReservation: a lookup made while a reservation
// is not on disk yet answers once a write holds it, and is not held up by
// reservations made after it began (a burst of ADDs cannot starve it).
func TestCheckpointReadWaitsForReservation(t *testing.T) {
	c, writes, inWrite, release := gatedCheckpoint(t, 2, 0)
	waitA := c.reserve(Endpoint{ContainerID: "a"})
	doneA := make(chan error, 1)
	go func() { doneA <- waitA() }()
	<-inWrite // a's write is in flight
	looked := make(chan int32, 1)
	go func() {
		if _, ok := c.get("a"); !ok {
			t.Error("the reserved endpoint was not found")
		}
		looked <- writes.Load()
	}()
	select {
	case <-looked:
		t.Fatal("a lookup answered before the reservation was written")
	case <-time.After(50 * time.Millisecond):
	}
	// b is reserved after the lookup began (and after a's write took its
	// copy); its wait is not called yet.
	waitB := c.reserve(Endpoint{ContainerID: "b"})
	release <- struct{}{}
	if err := <-doneA; err != nil {
		t.Fatal(err)
	}
	select {
	case w := <-looked:
		if w != 1 {
			t.Errorf("the lookup answered after %d writes, want 1", w)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the lookup waited on a reservation made after it began")
	}
	close(release)
	if err := waitB(); err != nil {
		t.Fatal(err)
	}
	if w := writes.Load(); w != 2 {
		t.Errorf("%d writes, want 2 (b came after a's write began)", w)
	}
	// A wait called twice does not undo another reservation's count.
	if err := waitB(); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	r := c.reserving
	c.mu.Unlock()
	if r != 0 {
		t.Errorf("%d reservations in flight after both waits, want 0", r)
	}
}

// TestCheckpointReadWaitsForReservationAfterWrite: a reservation made
// while another write runs (which does not hold it) is waited for by a
// lookup until its own write does, even when that write has not begun as
// the first one ends.
func TestCheckpointReadWaitsForReservationAfterWrite(t *testing.T) {
	for range 20 { // the lookup and the reservation's wait wake in either order
		c, writes, inWrite, release := gatedCheckpoint(t, 4, 4)
		putDone := make(chan error, 1)
		go func() { putDone <- c.put(Endpoint{ContainerID: "x"}) }()
		<-inWrite // x's write is in flight, without a
		waitA := c.reserve(Endpoint{ContainerID: "a"})
		looked := make(chan int32, 1)
		go func() {
			c.get("a")
			looked <- writes.Load()
		}()
		aDone := make(chan error, 1)
		go func() { aDone <- waitA() }()
		time.Sleep(time.Millisecond)
		release <- struct{}{} // x's write ends; a's begins
		<-inWrite
		select {
		case w := <-looked:
			t.Fatalf("a lookup answered after %d writes, before a's own write ended", w)
		case <-time.After(20 * time.Millisecond):
		}
		release <- struct{}{}
		for _, ch := range []chan error{putDone, aDone} {
			if err := <-ch; err != nil {
				t.Fatal(err)
			}
		}
		if w := <-looked; w != 2 {
			t.Errorf("the lookup answered after %d writes, want 2", w)
		}
	}
}
