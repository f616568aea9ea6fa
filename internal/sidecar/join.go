package sidecar

import (
	"context"
	"strings"
)

// JoinConfig configures join mode.
type JoinConfig struct {
	Options
	Client ClientConfig
}

// Join registers this pod and keeps its files current until ctx ends; then
// it deregisters at once.
func Join(ctx context.Context, cfg JoinConfig) error {
	var eps []string
	mets, err := cfg.begin(true, func() (err error) { eps, err = cfg.Client.endpoints(); return err })
	if err != nil {
		return err
	}
	cli, err := NewClient(cfg.Client)
	if err != nil {
		return err
	}
	defer cli.Close()
	st := &memberState{}
	stopHealth, err := startHealth(cfg.HealthAddr, func() (bool, string) { return st.ready(cfg.Member.Register) }, cfg.Metrics, nil, cfg.Log)
	if err != nil {
		return err
	}
	defer stopHealth()
	cfg.Log.Info("joining rendezvous", "endpoints", strings.Join(eps, ","), "register", cfg.Member.Register,
		"member", cfg.Member.Member.Host, "files_dir", cfg.Member.FilesDir)
	runMember(ctx, cli, cfg.Member, cfg.Log, st, mets)
	return nil
}
