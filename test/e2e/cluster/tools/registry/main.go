// Command registry is the local cluster's OCI registry (test/e2e/cluster/up.sh starts it on $LOCAL_REGISTRY):
// go-containerregistry's registry, its blobs on disk (a trainer image is gigabytes), plain HTTP on the node
// network only. `make images REGISTRY=$LOCAL_REGISTRY PUSH=1 PLAIN_HTTP=1` pushes to it and every node's
// containerd pulls from it (lib.sh writes their hosts.toml), as a cluster pulls from a real registry.
package main

import (
	"flag"
	"log"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:5000", "address to serve on (host:port)")
	dir := flag.String("dir", "", "directory of the blobs (required); manifests live in memory, so a restart empties the registry")
	flag.Parse()
	if *dir == "" {
		log.Fatal("registry: --dir is required")
	}
	if err := os.MkdirAll(filepath.Clean(*dir), 0o755); err != nil {
		log.Fatalf("registry: %v", err)
	}
	s := &http.Server{
		Addr:              *addr,
		ReadHeaderTimeout: 10 * time.Second,
		Handler:           registry.New(registry.WithBlobHandler(registry.NewDiskBlobHandler(*dir))),
	}
	log.Printf("registry: serving on %s, blobs in %s", *addr, *dir)
	log.Fatal(s.ListenAndServe())
}
