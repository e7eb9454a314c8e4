package datapath

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"syscall"
	"testing"
)

// netnsEnv holds, in the re-executed test binary, the network namespace
// of the parent it left.
const netnsEnv = "LACE_DATAPATH_TEST_NETNS"

// TestMain runs the package's tests, as root, in a network namespace of
// their own: BPF_PROG_RUN executes in the caller's namespace, and a
// program that sends a packet itself (bpf_clone_redirect: the reset ahead
// of a reused node port) would otherwise send it out of the machine's
// interfaces, toward wherever the machine's routes point. FIB lookups
// also stop depending on the machine's routes.
func TestMain(m *testing.M) {
	if os.Geteuid() == 0 && !isolated() {
		if os.Getenv(netnsEnv) != "" {
			fmt.Fprintln(os.Stderr, "the tests are not in a fresh network namespace of their own (unshare --net failed?)")
			os.Exit(1)
		}
		cmd := exec.Command("unshare", append([]string{"--net", "--", os.Args[0]}, os.Args[1:]...)...)
		cmd.Env = append(os.Environ(), netnsEnv+"="+netnsID())
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
		// Killed with its parent (go test's timeout kills only the parent).
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		err := cmd.Run()
		var exit *exec.ExitError
		switch {
		case err == nil:
			os.Exit(0)
		case errors.As(err, &exit):
			os.Exit(exit.ExitCode())
		default:
			fmt.Fprintf(os.Stderr, "run the tests in a network namespace of their own (unshare --net): %v\n", err)
			os.Exit(1)
		}
	}
	// Helpers the tests start (the test binary again, in namespaces the
	// tests made under this one, TestUDPClientHelper) are at home there.
	os.Setenv(netnsTestsEnv, netnsID())
	os.Exit(m.Run())
}

// netnsTestsEnv holds, for the processes the tests start, the fresh
// namespace the tests run in.
const netnsTestsEnv = "LACE_DATAPATH_TESTS_NETNS"

// isolated tells whether this process is the re-executed binary in a
// fresh network namespace (another one than its parent's, holding nothing
// but loopback: an inherited variable alone proves nothing), or a helper
// the tests started in a namespace they made (away from both).
func isolated() bool {
	parent := os.Getenv(netnsEnv)
	self := netnsID()
	if parent == "" || parent == self {
		return false
	}
	if tests := os.Getenv(netnsTestsEnv); tests != "" && tests != self {
		return true
	}
	ifs, err := net.Interfaces()
	return err == nil && len(ifs) == 1 && ifs[0].Flags&net.FlagLoopback != 0
}

// ownNetns tells whether the tests run away from their parent's network
// namespace (TestMain checked it was fresh).
func ownNetns() bool {
	parent := os.Getenv(netnsEnv)
	return parent != "" && parent != netnsID()
}

func netnsID() string {
	id, _ := os.Readlink("/proc/self/ns/net")
	return id
}
