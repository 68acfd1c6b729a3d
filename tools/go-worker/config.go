package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/url"
	"os"
	"strings"
)

// Defaults: the topic names of podium/topics.py and the group of docs/subagent-contract.md.
const (
	defaultAssignedTopic = "podium.subtasks.assigned.v1"
	defaultResultsTopic  = "podium.subtasks.results.v1"
	defaultGroup         = "subagent-external"
)

// Config is the worker's settings, read from the environment (docs/subagent-contract.md).
type Config struct {
	// Brokers are the bootstrap servers (host:port) of PODIUM_BUS.
	Brokers []string
	// SecurityProtocol is PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL (PODIUM_BUS's
	// security_protocol parameter).
	SecurityProtocol string
	// SASLMechanism is SCRAM-SHA-512 or SCRAM-SHA-256.
	SASLMechanism string
	// SASLUsername and SASLPassword authenticate (the password from
	// PODIUM_KAFKA_SASL_PASSWORD, never from the URL).
	SASLUsername, SASLPassword string
	// CAFile verifies the broker's certificate; empty = the system roots.
	CAFile string
	// Agents are the pool-spec names of the `runner: external` agents this worker executes
	// (PODIUM_EXTERNAL_AGENTS, comma-separated).
	Agents map[string]bool
	// Group is the worker's consumer group (PODIUM_GROUP_ID), never subagent_svc's.
	Group string
	// AssignedTopic and ResultsTopic are read and written (PODIUM_ASSIGNED_TOPIC,
	// PODIUM_RESULTS_TOPIC).
	AssignedTopic, ResultsTopic string
	// Executor names this worker in results and envelopes (PODIUM_WORKER_ID).
	Executor string
	// ResetLatest starts a group that has no committed offset at the end of the topic
	// instead of its start (PODIUM_OFFSET_RESET=latest): an assignment published before the
	// group first joined is then never seen, so the default is earliest.
	ResetLatest bool
}

// parseBusURL reads kafka://host:port[,host:port][?security_protocol=...&sasl_mechanism=...
// &sasl_username=...&ssl_cafile=...] into cfg, checking every value it uses. Those four are
// the parameters it reads; any other parameter of a Podium bus URL tunes Podium's own Python
// client and is ignored here, so one URL serves both.
func parseBusURL(raw string, cfg *Config) error {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "kafka" || u.Host == "" {
		return fmt.Errorf("PODIUM_BUS must be kafka://host:port[,host:port][?...], got %q", raw)
	}
	for _, hp := range strings.Split(u.Host, ",") {
		if !strings.Contains(hp, ":") {
			return fmt.Errorf("PODIUM_BUS: broker %q is not host:port", hp)
		}
		cfg.Brokers = append(cfg.Brokers, hp)
	}
	q := u.Query()
	cfg.SecurityProtocol = strings.ToUpper(valueOr(q.Get("security_protocol"), "PLAINTEXT"))
	cfg.SASLMechanism = strings.ToUpper(valueOr(q.Get("sasl_mechanism"), "SCRAM-SHA-512"))
	cfg.SASLUsername = q.Get("sasl_username")
	cfg.CAFile = q.Get("ssl_cafile")
	switch cfg.SecurityProtocol {
	case "PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL":
	default:
		return fmt.Errorf("PODIUM_BUS: security_protocol must be PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL, got %q", cfg.SecurityProtocol)
	}
	if cfg.sasl() {
		if cfg.SASLMechanism != "SCRAM-SHA-512" && cfg.SASLMechanism != "SCRAM-SHA-256" {
			return fmt.Errorf("PODIUM_BUS: sasl_mechanism must be SCRAM-SHA-512 or SCRAM-SHA-256, got %q", cfg.SASLMechanism)
		}
		if cfg.SASLUsername == "" {
			return fmt.Errorf("PODIUM_BUS: security_protocol %s needs sasl_username", cfg.SecurityProtocol)
		}
	}
	return nil
}

func valueOr(v, fallback string) string {
	if v == "" {
		return fallback
	}
	return v
}

func (c *Config) sasl() bool { return strings.HasPrefix(c.SecurityProtocol, "SASL") }

func (c *Config) tls() bool { return strings.HasSuffix(c.SecurityProtocol, "SSL") }

// loadConfig reads the worker's settings from getenv; an error names the variable.
func loadConfig(getenv func(string) string) (*Config, error) {
	cfg := &Config{Agents: map[string]bool{}}
	if err := parseBusURL(getenv("PODIUM_BUS"), cfg); err != nil {
		return nil, err
	}
	cfg.SASLPassword = getenv("PODIUM_KAFKA_SASL_PASSWORD")
	if cfg.sasl() && cfg.SASLPassword == "" {
		return nil, fmt.Errorf("PODIUM_KAFKA_SASL_PASSWORD is not set (PODIUM_BUS uses %s)", cfg.SecurityProtocol)
	}
	for _, name := range strings.Split(getenv("PODIUM_EXTERNAL_AGENTS"), ",") {
		if name = strings.TrimSpace(name); name != "" {
			cfg.Agents[name] = true
		}
	}
	if len(cfg.Agents) == 0 {
		return nil, fmt.Errorf("PODIUM_EXTERNAL_AGENTS is empty: name the runner: external agents this worker executes (comma-separated)")
	}
	cfg.Group = valueOr(getenv("PODIUM_GROUP_ID"), defaultGroup)
	cfg.AssignedTopic = valueOr(getenv("PODIUM_ASSIGNED_TOPIC"), defaultAssignedTopic)
	cfg.ResultsTopic = valueOr(getenv("PODIUM_RESULTS_TOPIC"), defaultResultsTopic)
	host, _ := os.Hostname()
	cfg.Executor = valueOr(getenv("PODIUM_WORKER_ID"), "go-worker/"+valueOr(host, "unknown"))
	switch reset := valueOr(getenv("PODIUM_OFFSET_RESET"), "earliest"); reset {
	case "earliest":
	case "latest":
		cfg.ResetLatest = true
	default:
		return nil, fmt.Errorf("PODIUM_OFFSET_RESET must be earliest or latest, got %q", reset)
	}
	return cfg, nil
}

// tlsConfig is the TLS client configuration: the CA file's roots when given.
func (c *Config) tlsConfig() (*tls.Config, error) {
	conf := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.CAFile == "" {
		return conf, nil
	}
	pem, err := os.ReadFile(c.CAFile)
	if err != nil {
		return nil, fmt.Errorf("PODIUM_BUS ssl_cafile: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("PODIUM_BUS ssl_cafile %s holds no PEM certificate", c.CAFile)
	}
	conf.RootCAs = pool
	return conf, nil
}
