package agent

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/lace-cni/lace/internal/model"
)

// nodeListeners are the ports the node's own sockets serve (the agent
// runs in the node's network namespace, so /proc/net is the node's): TCP
// sockets in LISTEN, and unconnected UDP sockets bound outside the
// ephemeral range (a client's unconnected socket there is no server, and
// would make hostPorts come and go). A hostPort never takes one of them:
// a pod publishing 127.0.0.1:53 must not capture the node's resolver
// (kubenet's hostport manager refused a port already in use, too). A
// socket bound to the wildcard address reserves the port on every
// address, of both families.
func nodeListeners(procNet string) ([]model.ReservedPort, error) {
	lo, hi := 32768, 60999
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			l, err1 := strconv.Atoi(f[0])
			h, err2 := strconv.Atoi(f[1])
			if err1 == nil && err2 == nil {
				lo, hi = l, h
			}
		}
	}
	var out []model.ReservedPort
	for _, f := range []struct {
		file  string
		proto uint8
	}{{"tcp", 6}, {"tcp6", 6}, {"udp", 17}, {"udp6", 17}} {
		got, err := readListeners(filepath.Join(procNet, f.file), f.proto, lo, hi)
		if err != nil {
			if os.IsNotExist(err) {
				continue
			}
			return nil, err
		}
		out = append(out, got...)
	}
	return out, nil
}

func readListeners(path string, proto uint8, lo, hi int) ([]model.ReservedPort, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	var out []model.ReservedPort
	seen := map[model.ReservedPort]bool{}
	sc := bufio.NewScanner(fh)
	sc.Scan() // header
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 {
			continue
		}
		addr, port, err := procAddr(f[1])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		_, rport, err := procAddr(f[2])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		switch {
		case proto == 6 && f[3] != "0A":
			continue
		case proto == 17 && (rport != 0 || (int(port) >= lo && int(port) <= hi)):
			continue
		}
		r := model.ReservedPort{Proto: proto, Port: port, What: "listening socket"}
		if !addr.IsUnspecified() {
			r.Addr = addr
		}
		if !seen[r] {
			seen[r] = true
			out = append(out, r)
		}
	}
	return out, sc.Err()
}

// procAddr parses /proc/net's ADDR:PORT (the address as the kernel's
// 32-bit words in host order, little endian here).
func procAddr(s string) (netip.Addr, uint16, error) {
	a, p, ok := strings.Cut(s, ":")
	if !ok {
		return netip.Addr{}, 0, fmt.Errorf("bad address %q", s)
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return netip.Addr{}, 0, fmt.Errorf("bad port %q", s)
	}
	b, err := hex.DecodeString(a)
	if err != nil || (len(b) != 4 && len(b) != 16) {
		return netip.Addr{}, 0, fmt.Errorf("bad address %q", s)
	}
	for i := 0; i < len(b); i += 4 {
		binary.BigEndian.PutUint32(b[i:], binary.LittleEndian.Uint32(b[i:]))
	}
	addr, _ := netip.AddrFromSlice(b)
	return addr.Unmap(), uint16(port), nil
}
