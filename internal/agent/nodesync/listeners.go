package nodesync

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
// sockets in LISTEN, and unconnected UDP sockets, whatever their port: a
// UDP server inside the ephemeral range (WireGuard's 51820, Tailscale's
// 41641) looks like a client's unconnected socket, and both lose their
// traffic to a hostPort on their port. A client cannot make a served
// hostPort go away by drawing its port: the agent keeps served hostPorts
// out of the node's ephemeral ports (localports.go). A hostPort never
// takes one of them: a pod publishing 127.0.0.1:53 must not capture the
// node's resolver (kubenet's hostport manager refused a port already in
// use, too). A socket bound to the wildcard address reserves the port on
// every address, of both families.
func nodeListeners(procNet string) ([]model.ReservedPort, error) {
	var out []model.ReservedPort
	for _, f := range []struct {
		file  string
		proto uint8
	}{{"tcp", 6}, {"tcp6", 6}, {"udp", 17}, {"udp6", 17}} {
		got, err := readListeners(filepath.Join(procNet, f.file), f.proto)
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

func readListeners(path string, proto uint8) ([]model.ReservedPort, error) {
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
		case proto == 17 && rport != 0:
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
