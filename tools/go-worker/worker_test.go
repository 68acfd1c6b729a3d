package main

import (
	"strings"
	"testing"
	"time"

	podiumpb "podium/goworker/pb"
)

// The same id subagent_svc.app.result_event_id gives (Python's uuid.uuid5).
func TestResultEventIDMatchesPython(t *testing.T) {
	if got, want := resultEventID("s.r.0"), "2e701cfd-0c22-5c48-a6ce-820852903e45"; got != want {
		t.Fatalf("resultEventID(s.r.0) = %s, want %s", got, want)
	}
}

func TestConfigNamesTheBadVariable(t *testing.T) {
	env := map[string]string{
		"PODIUM_BUS":             "kafka://b:9093?security_protocol=SASL_SSL&sasl_username=u&linger_ms=5",
		"PODIUM_EXTERNAL_AGENTS": "go-a, go-b",
	}
	get := func(k string) string { return env[k] }
	if _, err := loadConfig(get); err == nil || !strings.Contains(err.Error(), "PODIUM_KAFKA_SASL_PASSWORD") {
		t.Fatalf("want a missing-password error, got %v", err)
	}
	env["PODIUM_KAFKA_SASL_PASSWORD"] = "p"
	cfg, err := loadConfig(get)
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.Agents["go-a"] || !cfg.Agents["go-b"] || cfg.Group != defaultGroup || cfg.SASLMechanism != "SCRAM-SHA-512" {
		t.Fatalf("unexpected config %+v", cfg)
	}
	env["PODIUM_BUS"] = "http://b:9093"
	if _, err := loadConfig(get); err == nil || !strings.Contains(err.Error(), "PODIUM_BUS") {
		t.Fatalf("want a PODIUM_BUS error, got %v", err)
	}
}

func TestExecuteRecordsContextTimesAndDigest(t *testing.T) {
	a := &podiumpb.SubtaskAssigned{
		SessionId: "s", ExecutionId: "s.r.0", SubtaskId: "t", Kind: "test", Agent: "go-a", SimTime: 2,
		Context: &podiumpb.ExecutionContext{
			Subtask:           &podiumpb.SubtaskSpec{Id: "t", Kind: "test", Work: 1},
			DependencyResults: []*podiumpb.DependencyResult{{SubtaskId: "d", Output: "x"}},
		},
	}
	clock := time.Unix(100, 0)
	now := func() time.Time { clock = clock.Add(250 * time.Millisecond); return clock }
	// Published one second before it ran: it waited 1.25 s (the first now() is at 100.25).
	r := execute(a, time.Unix(99, 0), "go-worker/test", now)
	if r.GetOutcome() != podiumpb.Outcome_OUTCOME_SUCCESS || !strings.HasPrefix(r.GetOutput(), "test:t:") {
		t.Fatalf("unexpected result %v", r)
	}
	if r.GetWallEnd()-r.GetWallStart() != 0.25 || r.GetStartTime() != 3.25 || r.GetEndTime() != 3.5 || r.GetContext() != a.GetContext() {
		t.Fatalf("times or context wrong: %v", r)
	}
	a.Context.DependencyResults[0].Output = "y"
	if execute(a, time.Time{}, "go-worker/test", now).GetOutput() == r.GetOutput() {
		t.Fatal("a dependency's output changed but the output did not")
	}
}
