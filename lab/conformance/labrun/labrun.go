// Package labrun brings up the lab a conformance run needs and takes it
// down after, for both suites (make conformance, make
// conformance-policy-api). It drives the lace-lab binary only; what runs
// on the lab is the caller's.
package labrun

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
)

// Lab is a lab by name, driven through the lace-lab binary LaceLab; what
// lace-lab prints goes to Out.
type Lab struct {
	LaceLab, Name string
	Out           io.Writer
}

// Ensure returns the lab's kubeconfig, bringing it up with upArgs (after
// --name) when it does not run; up tells that it did, even when bringing
// it up then failed, so that the caller takes the pieces down.
func (l Lab) Ensure(ctx context.Context, upArgs ...string) (kubeconfig string, up bool, err error) {
	if exec.CommandContext(ctx, l.LaceLab, "status", "--name", l.Name).Run() != nil {
		up = true
		fmt.Fprintf(l.Out, "bringing lab %s up\n", l.Name)
		c := exec.CommandContext(ctx, l.LaceLab, append([]string{"up", "--name", l.Name}, upArgs...)...)
		c.Stdout, c.Stderr = l.Out, os.Stderr
		if err := c.Run(); err != nil {
			return "", up, fmt.Errorf("lace-lab up --name %s: %w", l.Name, err)
		}
	} else {
		fmt.Fprintf(l.Out, "using lab %s, which runs (it stays up)\n", l.Name)
	}
	b, err := exec.CommandContext(ctx, l.LaceLab, "kubeconfig", "--name", l.Name).Output()
	if err != nil {
		return "", up, fmt.Errorf("lace-lab kubeconfig --name %s: %w", l.Name, err)
	}
	return strings.TrimSpace(string(b)), up, nil
}

// Down takes the lab down; meant for a defer, so it runs when the run
// failed or was interrupted too (a new context: the run's may be done).
func (l Lab) Down() {
	fmt.Fprintf(l.Out, "taking lab %s down\n", l.Name)
	c := exec.Command(l.LaceLab, "down", "--name", l.Name)
	c.Stdout, c.Stderr = l.Out, os.Stderr
	if err := c.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "lace-lab down --name %s: %v\n", l.Name, err)
	}
}

// Load imports an image tarball into every node of the lab.
func (l Lab) Load(ctx context.Context, tar string) error {
	c := exec.CommandContext(ctx, l.LaceLab, "load", "--name", l.Name, tar)
	c.Stdout, c.Stderr = l.Out, os.Stderr
	if err := c.Run(); err != nil {
		return fmt.Errorf("lace-lab load %s: %w", tar, err)
	}
	return nil
}
