//go:build lace_ctv2

package datapath

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// TestCTv2MigrationConverts: the lace_ctv2 build's migration turns a
// release (version 1) conntrack value into the same flow in its layout.
func TestCTv2MigrationConverts(t *testing.T) {
	v1 := make([]byte, 40)
	binary.LittleEndian.PutUint64(v1[0:], 123456789)    // expires
	binary.LittleEndian.PutUint32(v1[8:], 7)            // peer_net
	binary.LittleEndian.PutUint16(v1[12:], ctSeenReply) // flags
	binary.LittleEndian.PutUint16(v1[14:], 0x3412)      // snat_port
	copy(v1[16:32], []byte{10, 96, 0, 1})               // nat_addr
	binary.LittleEndian.PutUint16(v1[32:], 0x5000)      // nat_port
	_, nv, keep := migrations["lace_ct"][layoutVersion("lace_ct")-1].Convert(make([]byte, 40), v1)
	var got podCtVal
	if err := binary.Read(bytes.NewReader(nv), binary.LittleEndian, &got); err != nil || !keep {
		t.Fatalf("decode: %v (keep %v)", err, keep)
	}
	if got.Expires != 123456789 || got.PeerNet != 7 || got.Flags != ctSeenReply || got.SnatPort != 0x3412 ||
		got.NatAddr[1] != 96 || got.NatPort != 0x5000 {
		t.Errorf("converted %+v", got)
	}
}
