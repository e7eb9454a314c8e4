package netutil

import (
	"fmt"
	"net"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Capture records the frames seen on ifName (in the namespace at nsPath)
// while f runs, with a raw packet socket. It is for tests and diagnostics.
func Capture(nsPath, ifName string, f func()) ([][]byte, error) {
	proto := htons(unix.ETH_P_ALL)
	var fd int
	err := Do(nsPath, func() error {
		var err error
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(proto))
		if err != nil {
			return fmt.Errorf("packet socket: %w", err)
		}
		iface, err := net.InterfaceByName(ifName)
		if err != nil {
			unix.Close(fd)
			return fmt.Errorf("find %s: %w", ifName, err)
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: proto, Ifindex: iface.Index}); err != nil {
			unix.Close(fd)
			return fmt.Errorf("bind to %s: %w", ifName, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	tv := unix.NsecToTimeval((100 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return nil, err
	}
	var (
		mu      sync.Mutex
		frames  [][]byte
		readErr error
		done    = make(chan struct{})
		exited  = make(chan struct{})
	)
	go func() {
		defer close(exited)
		buf := make([]byte, 65536)
		// The socket queues every frame from bind on, but this goroutine
		// may not run before f returns (a loaded machine): after f, the
		// queue is drained until it is empty (a receive times out) or for
		// a second at most, never dropped.
		var drainUntil time.Time
		for {
			n, _, err := unix.Recvfrom(fd, buf, 0)
			if err != nil && err != unix.EAGAIN && err != unix.EINTR {
				// The interface went away or down: what f did after
				// this was not seen, which the caller must know.
				mu.Lock()
				readErr = fmt.Errorf("capture on %s: %w", ifName, err)
				mu.Unlock()
				return
			}
			if err != nil || n == 0 {
				select {
				case <-done:
					return
				default:
				}
				continue
			}
			select {
			case <-done:
				if drainUntil.IsZero() {
					drainUntil = time.Now().Add(time.Second)
				} else if time.Now().After(drainUntil) {
					return
				}
			default:
			}
			mu.Lock()
			frames = append(frames, append([]byte(nil), buf[:n]...))
			mu.Unlock()
		}
	}()
	// f may not return (a test's t.Fatal ends its goroutine): the reader
	// still stops before the socket closes. A reader left behind spun on
	// the closed descriptor, a core lost for the rest of the run, which
	// later timing-sensitive tests paid for (CI: oracle and SNAT
	// timeouts after a failed TestL2Flood).
	var once sync.Once
	stop := func() { once.Do(func() { close(done); <-exited }) }
	defer stop()
	f()
	stop()
	mu.Lock()
	defer mu.Unlock()
	return frames, readErr
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
