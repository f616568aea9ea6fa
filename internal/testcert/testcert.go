// Package testcert makes a throwaway CA, a serving certificate and a client
// certificate for tests and benchmarks of the webhook and the sidecar (never for
// production: the chart or cert-manager issues those).
package testcert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Pair is a CA, a serving certificate and a client certificate signed by it, PEM encoded.
type Pair struct {
	CA, Cert, Key         []byte
	ClientCert, ClientKey []byte
}

// New returns a CA and a certificate for hosts (IP addresses or DNS names), valid for a day.
func New(hosts ...string) (*Pair, error) { return newPair(hosts) }

// NewServerClient is New, but the serving certificate is also a client
// certificate: the rendezvous TLS Secret holds one tls.crt that the sidecar
// serves with and that every rendezvous client (join, torchrun) presents.
func NewServerClient(hosts ...string) (*Pair, error) {
	return newPair(hosts, x509.ExtKeyUsageClientAuth)
}

func newPair(hosts []string, moreServingUsages ...x509.ExtKeyUsage) (*Pair, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "elastic-training test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, _ := x509.ParseCertificate(caDER)
	p := &Pair{CA: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})}
	if p.Cert, p.Key, err = issue(ca, caKey, 2, x509.ExtKeyUsageServerAuth, hosts, moreServingUsages...); err != nil {
		return nil, err
	}
	if p.ClientCert, p.ClientKey, err = issue(ca, caKey, 3, x509.ExtKeyUsageClientAuth, []string{"client"}); err != nil {
		return nil, err
	}
	return p, nil
}

func issue(ca *x509.Certificate, caKey *ecdsa.PrivateKey, serial int64, usage x509.ExtKeyUsage, hosts []string, more ...x509.ExtKeyUsage) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: hosts[0]},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: append([]x509.ExtKeyUsage{usage}, more...),
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}

// WriteDir writes tls.crt, tls.key, ca.crt, client.crt and client.key into dir.
func (p *Pair) WriteDir(dir string) error {
	for name, b := range map[string][]byte{"tls.crt": p.Cert, "tls.key": p.Key, "ca.crt": p.CA, "client.crt": p.ClientCert, "client.key": p.ClientKey} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
	}
	return nil
}
