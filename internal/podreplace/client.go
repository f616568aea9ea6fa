package podreplace

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// Client asks the webhook for replacements, as the pod whose token is in TokenFile.
type Client struct {
	url       string
	tokenFile string
	http      *http.Client
}

// requestTimeout bounds one ask: the webhook reviews a token, reads two pods and deletes one.
const requestTimeout = 15 * time.Second

// CheckURL says whether raw is a URL a serving sidecar may ask at: https, a host, no user, query or fragment. The
// webhook checks its --pod-replacement-url with it at start (a typo fails there, not in each job at its first hang).
func CheckURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("%q: want https://<service>.<namespace>.svc:443%s", raw, Path)
	}
	return nil
}

// NewClient is a client of the webhook at rawURL (https, its Path), trusting the certificates signed by caPEM.
// It never uses a proxy: the webhook is a Service of the cluster.
func NewClient(rawURL string, caPEM []byte, tokenFile string) (*Client, error) {
	if err := CheckURL(rawURL); err != nil {
		return nil, fmt.Errorf("webhook URL: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("webhook CA: no PEM certificate in it")
	}
	if tokenFile == "" {
		return nil, errors.New("webhook token file: empty")
	}
	tr := &http.Transport{Proxy: nil, TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		MaxIdleConns: 1, IdleConnTimeout: time.Minute}
	return &Client{url: rawURL, tokenFile: tokenFile, http: &http.Client{Transport: tr, Timeout: requestTimeout}}, nil
}

// Replace asks for r.Pod to be replaced. An error says why not: the webhook's refusal, or that it was not reached.
func (c *Client) Replace(ctx context.Context, r Request) (Response, error) {
	// The kubelet rewrites the token before it expires: read it for every ask.
	tok, err := os.ReadFile(c.tokenFile)
	if err != nil {
		return Response{}, fmt.Errorf("the webhook token: %w", err)
	}
	body, err := json.Marshal(r)
	if err != nil {
		return Response{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(body))
	if err != nil {
		return Response{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	resp, err := c.http.Do(req)
	if err != nil {
		return Response{}, fmt.Errorf("asking the webhook: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, MaxRequestBytes+1))
	if err != nil {
		return Response{}, fmt.Errorf("the webhook's answer: %w", err)
	}
	var out Response
	if jerr := json.Unmarshal(b, &out); jerr != nil || len(b) > MaxRequestBytes {
		out = Response{Message: strings.TrimSpace(string(b[:min(len(b), 512)]))}
	}
	if resp.StatusCode != http.StatusOK {
		return out, fmt.Errorf("the webhook refused (%s): %s", resp.Status, out.Message)
	}
	return out, nil
}
