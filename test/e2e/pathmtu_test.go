package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/lace-cni/lace/internal/netutil"
	"github.com/lace-cni/lace/lab"
)

// TestStreamSurvivesFabricMTUDrop holds one TCP connection per family from
// a pod on n1 to a pod on n2 and moves large requests and answers over it;
// then the fabric's MTU drops from 1500 to 1400 under it. The pods keep
// their MTU (1460): the nodes answer oversize packets with fragmentation
// needed / packet too big, path MTU discovery shrinks the segments, and
// the same connections carry on.
func TestStreamSurvivesFabricMTUDrop(t *testing.T) {
	needLab(t)
	a := netPod(t, "pmtu-a", "default", "n1", true)
	b := netPod(t, "pmtu-b", "default", "n2", true)
	b4, b6 := podAddrs(b)
	before := nodeDrops(t, "n1")["too-big"] + nodeDrops(t, "n2")["too-big"]

	type stream struct {
		conn net.Conn
		r    *bufio.Reader
	}
	var streams []stream
	for _, dst := range []netip.Addr{b4, b6} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		conn, err := netutil.DialContext(ctx, podNetNS(t, a), "tcp", net.JoinHostPort(dst.String(), "8080"))
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		streams = append(streams, stream{conn, bufio.NewReader(conn)})
	}
	exchange := func(when string) {
		t.Helper()
		for i, s := range streams {
			// a -> b: 256 KiB upload in full-size segments; b -> a: a
			// 3000-byte echo, more than one segment.
			if err := upload(s.conn, s.r, 256<<10); err != nil {
				t.Fatalf("%s, stream %d: upload: %v (drops n1 %v, n2 %v)", when, i, err, nodeDrops(t, "n1"), nodeDrops(t, "n2"))
			}
			msg := strings.Repeat("m", 3000)
			if got, err := httpGet(s.conn, s.r, "/echo?msg="+msg); err != nil || got != msg {
				t.Fatalf("%s, stream %d: echo: %d bytes, %v", when, i, len(got), err)
			}
		}
	}
	exchange("at MTU 1500")

	cfg := labConfig()
	fabric := netutil.Path(cfg.NetNS("fabric"))
	links := []struct{ ns, link string }{
		{netutil.Path(cfg.NetNS("n1")), "eth0"}, {netutil.Path(cfg.NetNS("n2")), "eth0"}, {fabric, "n1"}, {fabric, "n2"},
	}
	setMTU := func(mtu int) {
		for _, l := range links {
			if err := netutil.SetMTU(l.ns, l.link, mtu); err != nil {
				t.Fatal(err)
			}
		}
	}
	setMTU(1400)
	defer setMTU(1500)
	exchange("after the fabric MTU dropped to 1400")

	if got := nodeDrops(t, "n1")["too-big"] + nodeDrops(t, "n2")["too-big"] - before; got == 0 {
		t.Error("no node answered too-big: the test did not cross the MTU")
	} else {
		t.Logf("%d too-big answers sent to the pods", got)
	}
}

// upload POSTs size bytes to agnhost netexec's /upload on an open
// connection and reads the answer.
func upload(conn net.Conn, r *bufio.Reader, size int) error {
	var body bytes.Buffer
	w := multipart.NewWriter(&body)
	f, err := w.CreateFormFile("file", "blob")
	if err != nil {
		return err
	}
	if _, err := f.Write(bytes.Repeat([]byte("x"), size)); err != nil {
		return err
	}
	w.Close()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	fmt.Fprintf(conn, "POST /upload HTTP/1.1\r\nHost: e2e\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n", w.FormDataContentType(), body.Len())
	if _, err := conn.Write(body.Bytes()); err != nil {
		return err
	}
	status, _, err := readResponse(r)
	if err != nil {
		return err
	}
	if !strings.HasPrefix(status, "HTTP/1.1 20") {
		return fmt.Errorf("status %q", status)
	}
	return nil
}

func httpGet(conn net.Conn, r *bufio.Reader, path string) (string, error) {
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: e2e\r\n\r\n", path)
	_, body, err := readResponse(r)
	return body, err
}

// readResponse reads one HTTP/1.1 response, with a Content-Length or a
// chunked body.
func readResponse(r *bufio.Reader) (status, body string, err error) {
	status, err = r.ReadString('\n')
	if err != nil {
		return "", "", err
	}
	length, chunked := 0, false
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return "", "", err
		}
		l := strings.ToLower(line)
		if v, ok := strings.CutPrefix(l, "content-length:"); ok {
			fmt.Sscanf(strings.TrimSpace(v), "%d", &length)
		}
		if strings.HasPrefix(l, "transfer-encoding:") && strings.Contains(l, "chunked") {
			chunked = true
		}
		if line == "\r\n" {
			break
		}
	}
	if !chunked {
		b := make([]byte, length)
		if _, err := io.ReadFull(r, b); err != nil {
			return "", "", err
		}
		return status, string(b), nil
	}
	var out strings.Builder
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return "", "", err
		}
		var n int
		if _, err := fmt.Sscanf(strings.TrimSpace(line), "%x", &n); err != nil {
			return "", "", fmt.Errorf("chunk size %q: %w", line, err)
		}
		b := make([]byte, n+2) // the chunk and its CRLF
		if _, err := io.ReadFull(r, b); err != nil {
			return "", "", err
		}
		if n == 0 {
			return status, out.String(), nil
		}
		out.Write(b[:n])
	}
}

// TestTracerouteShowsHops: traceroute from a pod to a pod on another node
// shows the pod's node (which answers the expiring probe with time
// exceeded) and then the destination, in both families.
func TestTracerouteShowsHops(t *testing.T) {
	needLab(t)
	a := netPod(t, "trace-a", "default", "n1", true)
	b := netPod(t, "trace-b", "default", "n3", true)
	b4, b6 := podAddrs(b)
	n1v4, n1v6 := lab.NodeUnderlay(1)
	for _, c := range []struct {
		dst, hop netip.Addr
		flag     string
	}{{b4, n1v4, "-4"}, {b6, n1v6, "-6"}} {
		out, err := exec.Command("nsenter", "--net="+podNetNS(t, a), "--", "traceroute", c.flag, "-n", "-q", "1", "-w", "2", "-m", "5", c.dst.String()).CombinedOutput()
		if err != nil {
			t.Fatalf("traceroute %s: %v\n%s", c.dst, err, out)
		}
		var hops []string
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n")[1:] {
			if f := strings.Fields(l); len(f) >= 2 {
				hops = append(hops, f[1])
			}
		}
		if len(hops) != 2 || hops[0] != c.hop.String() || hops[1] != c.dst.String() {
			t.Errorf("traceroute to %s: hops %v, want [%s %s]\n%s", c.dst, hops, c.hop, c.dst, out)
		}
	}
}
