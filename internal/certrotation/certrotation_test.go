package certrotation

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

func TestValidate(t *testing.T) {
	ok := Config{Secret: types.NamespacedName{Namespace: "ns", Name: "s"}, WebhookConfiguration: "wh", DNSName: "svc.ns.svc", CertDir: "/d"}
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"defaults", func(*Config) {}, ""},
		{"durations", func(c *Config) { c.CAValidity, c.CertValidity, c.Lookahead = time.Hour, 10*time.Minute, 5*time.Minute }, ""},
		{"no secret name", func(c *Config) { c.Secret.Name = "" }, "Secret's namespace and name"},
		{"no webhook configuration", func(c *Config) { c.WebhookConfiguration = "" }, "MutatingWebhookConfiguration"},
		{"no DNS name", func(c *Config) { c.DNSName = "" }, "DNS name"},
		{"no directory", func(c *Config) { c.CertDir = "" }, "directory"},
		{"lookahead past validity", func(c *Config) { c.CertValidity, c.Lookahead = time.Hour, time.Hour }, "renewed at once"},
		{"certificate outlasts CA", func(c *Config) { c.CAValidity, c.CertValidity = time.Hour, 2*time.Hour }, "cannot outlast"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			tc.edit(&c)
			err := c.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want an error with %q", err, tc.want)
			}
		})
	}
}

func TestWriteCerts(t *testing.T) {
	dir := t.TempDir()
	read := func(name string) string {
		b, _ := os.ReadFile(filepath.Join(dir, name))
		return string(b)
	}
	// A Secret the rotator has not filled yet writes nothing.
	if err := WriteCerts(dir, map[string][]byte{"tls.crt": []byte("c1")}); err != nil {
		t.Fatal(err)
	}
	if read("tls.crt") != "" {
		t.Fatal("a certificate without its key was written")
	}
	for _, v := range []string{"1", "2"} {
		data := map[string][]byte{"tls.crt": []byte("c" + v), "tls.key": []byte("k" + v), "ca.crt": []byte("ca" + v), "ca.key": []byte("secret")}
		if err := WriteCerts(dir, data); err != nil {
			t.Fatal(err)
		}
		if read("tls.crt") != "c"+v || read("tls.key") != "k"+v || read("ca.crt") != "ca"+v {
			t.Fatalf("after Secret %s: tls.crt %q, tls.key %q, ca.crt %q", v, read("tls.crt"), read("tls.key"), read("ca.crt"))
		}
	}
	if st, err := os.Stat(filepath.Join(dir, "tls.key")); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("tls.key: %v %v, want mode 0600", st.Mode(), err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 3 {
		t.Fatalf("dir holds %d files, want tls.crt, tls.key and ca.crt only (never the CA's key)", len(entries))
	}
}
