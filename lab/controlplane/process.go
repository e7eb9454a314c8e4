package controlplane

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// Process is a child process whose output goes to a log file.
type Process struct {
	Name    string
	LogPath string
	cmd     *exec.Cmd
	done    chan struct{}
	err     error
}

// StartProcess runs bin with args, logging to logPath. The child dies with
// the calling process (PDEATHSIG) so a crashed test leaves nothing behind.
func StartProcess(name, bin string, args []string, logPath string) (*Process, error) {
	return StartCommand(name, exec.Command(bin, args...), logPath)
}

// StartCommand starts cmd as StartProcess does, keeping whatever
// SysProcAttr the caller set (namespaces, for instance) and adding its own
// process group and PDEATHSIG.
func StartCommand(name string, cmd *exec.Cmd, logPath string) (*Process, error) {
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return nil, fmt.Errorf("create log dir for %s: %w", name, err)
	}
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open log for %s: %w", name, err)
	}
	if cmd.Stdout == nil {
		cmd.Stdout = logf
	}
	if cmd.Stderr == nil {
		cmd.Stderr = logf
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid, cmd.SysProcAttr.Pdeathsig = true, syscall.SIGKILL
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Process{Name: name, LogPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	return p, nil
}

// PID is the process ID.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Exited reports whether the process has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Stop sends SIGTERM to the process group, then SIGKILL after grace, and
// returns once the process and the rest of its group have ended: a
// program run through nsenter into a PID namespace is nsenter's child, in
// its group, and may outlive nsenter by the time it takes to shut down.
// Stopping an ended process whose group is gone is a no-op.
func (p *Process) Stop(grace time.Duration) {
	pgid := p.cmd.Process.Pid
	if p.Exited() && !groupAlive(pgid) {
		return
	}
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	deadline := time.After(grace)
	select {
	case <-p.done:
	case <-deadline:
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-p.done
	}
	// The group's other members: the rest of grace, then SIGKILL, then a
	// bounded wait (a killed process whose parent is slow to reap it stays
	// a member until it is reaped).
	killed := time.After(grace + 5*time.Second)
	for groupAlive(pgid) {
		select {
		case <-deadline:
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
		case <-killed:
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// groupAlive says whether process group pgid has a member.
func groupAlive(pgid int) bool { return syscall.Kill(-pgid, 0) == nil }

// LogTail returns the last n bytes of the process log, for error messages.
func (p *Process) LogTail(n int) string {
	b, err := os.ReadFile(p.LogPath)
	if err != nil {
		return ""
	}
	if len(b) > n {
		b = b[len(b)-n:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return string(b)
}

// ExitError describes how the process ended, or nil while it runs.
func (p *Process) ExitError() error {
	if !p.Exited() {
		return nil
	}
	if p.err == nil {
		return errors.New("exited with status 0")
	}
	return p.err
}

// FreePort returns a TCP port on loopback that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func hostPort(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }
