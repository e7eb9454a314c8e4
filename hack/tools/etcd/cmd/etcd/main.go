// Command etcd is the etcd server, built from the pinned module so that the
// tests and the lab need nothing but the Go module proxy.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
