// Command podium-go-worker executes Podium sub-agent assignments outside Podium: a worker
// for the pool spec's `runner: external` agents, written without Podium's Python code, on the
// protobuf contract of docs/subagent-contract.md (Go code generated from protos/ by
// scripts/go-worker.sh).
//
// It reads podium.subtasks.assigned.v1 in a consumer group of its own, executes the
// assignments of the agents named by PODIUM_EXTERNAL_AGENTS (others are skipped: subagent_svc
// executes them), publishes each SubtaskResult to podium.subtasks.results.v1 and commits the
// batch only after every result of it is acknowledged (at least once; the result's event id,
// uuid5 of the execution id, makes a re-execution a duplicate the orchestrator drops).
//
// Exit status: 0 stopped by SIGTERM/SIGINT; 2 a setting is invalid; 1 a broker failure.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"
	"google.golang.org/protobuf/proto"
)

func main() {
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	log.SetPrefix("go-worker: ")
	cfg, err := loadConfig(os.Getenv)
	if err != nil {
		log.Print(err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		log.Print(err)
		os.Exit(1)
	}
	log.Print("stopped")
}

// clientOptions are the Kafka client's settings for cfg: SCRAM over TLS as configured, the
// worker's own group, manual commits after the results are written, read-committed fetches.
func clientOptions(cfg *Config) ([]kgo.Opt, error) {
	opts := []kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ClientID(cfg.Executor),
		kgo.ConsumerGroup(cfg.Group),
		kgo.ConsumeTopics(cfg.AssignedTopic),
		kgo.DisableAutoCommit(),
		// Hold a rebalance until the batch in hand is executed and committed: no partition
		// moves to another member with work done but not committed.
		kgo.BlockRebalanceOnPoll(),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		// Uncompressed, as Podium's own producers write: envelopes are small, and any other
		// consumer of the topic may lack a codec library (it would fail on the whole batch).
		kgo.ProducerBatchCompression(kgo.NoCompression()),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, assigned map[string][]int32) {
			log.Printf("joined group %s: partitions %v", cfg.Group, assigned)
		}),
	}
	if cfg.ResetLatest {
		opts = append(opts, kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd()))
	} else {
		opts = append(opts, kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	}
	if cfg.tls() {
		conf, err := cfg.tlsConfig()
		if err != nil {
			return nil, err
		}
		opts = append(opts, kgo.DialTLSConfig(conf))
	}
	if cfg.sasl() {
		auth := scram.Auth{User: cfg.SASLUsername, Pass: cfg.SASLPassword}
		if cfg.SASLMechanism == "SCRAM-SHA-256" {
			opts = append(opts, kgo.SASL(auth.AsSha256Mechanism()))
		} else {
			opts = append(opts, kgo.SASL(auth.AsSha512Mechanism()))
		}
	}
	return opts, nil
}

func run(ctx context.Context, cfg *Config) error {
	opts, err := clientOptions(cfg)
	if err != nil {
		return err
	}
	client, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	// Close leaves the group, so the partitions move to another member at once; under
	// BlockRebalanceOnPoll it waits for the rebalance to be allowed, so allow it first.
	defer func() {
		client.AllowRebalance()
		client.Close()
	}()
	log.Printf("executing agents %v from %s in group %s as %s", keys(cfg.Agents), cfg.AssignedTopic, cfg.Group, cfg.Executor)
	for {
		fetches := client.PollRecords(ctx, 100)
		if fetches.IsClientClosed() {
			return nil
		}
		var fetchErr error
		waiting := false
		fetches.EachError(func(topic string, partition int32, err error) {
			switch {
			case errors.Is(err, context.Canceled):
			case retriable(err):
				// The client keeps retrying (a topic not created yet, a leader moving).
				log.Printf("fetch %s[%d]: %v (retrying)", topic, partition, err)
				waiting = true
			default:
				fetchErr = fmt.Errorf("fetch %s[%d]: %w", topic, partition, err)
			}
		})
		if fetchErr != nil {
			return fetchErr
		}
		if waiting && len(fetches.Records()) == 0 {
			time.Sleep(500 * time.Millisecond) // do not spin on an error the client retries
		}
		// Records in hand are executed and committed even when a stop was asked meanwhile.
		if err := handleBatch(client, cfg, fetches.Records()); err != nil {
			return err
		}
		client.AllowRebalance()
		if ctx.Err() != nil {
			return nil
		}
	}
}

// handleBatch executes the batch's assignments for cfg's agents, writes their results and
// commits the batch once every result is acknowledged. A record that is not an assignment
// is logged and passed over: subagent_svc's consumer dead-letters it, so it is kept there.
func handleBatch(client *kgo.Client, cfg *Config, records []*kgo.Record) error {
	var out []*kgo.Record
	for _, rec := range records {
		env, assigned, err := decodeAssignment(rec.Value)
		if err != nil {
			log.Printf("skipping %s[%d]@%d: %v", rec.Topic, rec.Partition, rec.Offset, err)
			continue
		}
		if !cfg.Agents[assigned.GetAgent()] {
			continue
		}
		var published time.Time
		if env.GetProducedAt() != nil {
			published = env.GetProducedAt().AsTime()
		}
		result := execute(assigned, published, cfg.Executor, time.Now)
		envelope, err := resultEnvelope(result, env, cfg.Executor, time.Now())
		if err != nil {
			return fmt.Errorf("encode the result of %s: %w", assigned.GetExecutionId(), err)
		}
		value, err := proto.Marshal(envelope)
		if err != nil {
			return fmt.Errorf("encode the result of %s: %w", assigned.GetExecutionId(), err)
		}
		out = append(out, resultRecord(cfg.ResultsTopic, envelope, value))
		log.Printf("executed %s (%s on %s): %s", assigned.GetExecutionId(), assigned.GetSubtaskId(), assigned.GetAgent(), result.GetOutcome())
	}
	if len(out) > 0 {
		// Not ctx: a result already computed is written even while stopping, then committed.
		if err := client.ProduceSync(context.Background(), out...).FirstErr(); err != nil {
			return fmt.Errorf("publish results: %w (the batch is not committed: it is redelivered)", err)
		}
	}
	if len(records) > 0 {
		if err := client.CommitRecords(context.Background(), records...); err != nil {
			return fmt.Errorf("commit: %w", err)
		}
	}
	return nil
}

// resultRecord is the Kafka record of a result: keyed by the session id (its events stay in
// one partition, as Podium's publishers key them) with the event id and type headers and the
// trace context.
func resultRecord(topic string, env interface {
	GetKey() string
	GetEventId() string
	GetType() string
	GetTraceContext() map[string]string
}, value []byte) *kgo.Record {
	headers := []kgo.RecordHeader{
		{Key: eventIDHeader, Value: []byte(env.GetEventId())},
		{Key: eventTypeHeader, Value: []byte(env.GetType())},
	}
	for k, v := range env.GetTraceContext() {
		headers = append(headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
	}
	return &kgo.Record{Topic: topic, Key: []byte(env.GetKey()), Value: value, Headers: headers}
}

// retriable says whether a fetch error is one the client recovers from by itself: Kafka's
// retriable error codes, and a topic that does not exist yet (the platform creates it).
func retriable(err error) bool {
	return kerr.IsRetriable(err) || errors.Is(err, kerr.UnknownTopicOrPartition)
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
