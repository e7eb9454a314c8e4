package datapath

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// netnsEnv marks the test binary as running in a network namespace of
// its own.
const netnsEnv = "LACE_DATAPATH_TEST_NETNS"

// TestMain runs the package's tests, as root, in a network namespace of
// their own: BPF_PROG_RUN executes in the caller's namespace, and a
// program that sends a packet itself (bpf_clone_redirect: the reset ahead
// of a reused node port) would otherwise send it out of the machine's
// interfaces, toward wherever the machine's routes point. FIB lookups
// also stop depending on the machine's routes.
func TestMain(m *testing.M) {
	if os.Geteuid() == 0 && os.Getenv(netnsEnv) == "" {
		cmd := exec.Command("unshare", append([]string{"--net", "--", os.Args[0]}, os.Args[1:]...)...)
		cmd.Env = append(os.Environ(), netnsEnv+"=1")
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
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
	os.Exit(m.Run())
}
