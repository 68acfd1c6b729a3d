package main

import (
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	podiumpb "podium/goworker/pb"
)

const (
	typeURLPrefix = "type.googleapis.com/"
	// schemaVersion is the envelope schema version Podium's codec writes (podium/codec.py).
	schemaVersion = 1
	// eventIDHeader and eventTypeHeader are the record headers Podium's publishers add
	// (podium/bus/consumer.py), readable without protobuf.
	eventIDHeader   = "podium.event_id"
	eventTypeHeader = "podium.event_type"
)

// resultNamespace is the namespace of result event ids: uuid5(namespace, execution id), as
// subagent_svc computes them, so a re-executed assignment yields the same event id whoever
// executed it and the orchestrator drops the copy.
var resultNamespace = [16]byte{
	0x6f, 0x1c, 0x1c, 0x9e, 0x2b, 0x7a, 0x4b, 0xd4, 0x9a, 0x55, 0x3d, 0x1f, 0x0d, 0x3c, 0x8a, 0x01,
}

// uuid5 is RFC 4122's name-based (SHA-1) UUID of name in namespace ns.
func uuid5(ns [16]byte, name string) string {
	h := sha1.New()
	h.Write(ns[:])
	h.Write([]byte(name))
	var u [16]byte
	copy(u[:], h.Sum(nil))
	u[6] = (u[6] & 0x0f) | 0x50
	u[8] = (u[8] & 0x3f) | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// resultEventID is the event id of the result of executionID (stable across re-executions).
func resultEventID(executionID string) string { return uuid5(resultNamespace, executionID) }

// decodeAssignment reads a record value as a Podium envelope holding a SubtaskAssigned.
func decodeAssignment(value []byte) (*podiumpb.Envelope, *podiumpb.SubtaskAssigned, error) {
	env := &podiumpb.Envelope{}
	if err := proto.Unmarshal(value, env); err != nil {
		return nil, nil, fmt.Errorf("not a podium.v1.Envelope: %w", err)
	}
	if env.GetEventId() == "" || env.GetPayload() == nil {
		return nil, nil, fmt.Errorf("envelope without event_id or payload")
	}
	want := typeURLPrefix + "podium.v1.SubtaskAssigned"
	if env.GetPayload().GetTypeUrl() != want {
		return nil, nil, fmt.Errorf("envelope %s holds %s, not %s", env.GetEventId(), env.GetPayload().GetTypeUrl(), want)
	}
	assigned := &podiumpb.SubtaskAssigned{}
	if err := proto.Unmarshal(env.GetPayload().GetValue(), assigned); err != nil {
		return nil, nil, fmt.Errorf("envelope %s: malformed SubtaskAssigned: %w", env.GetEventId(), err)
	}
	return env, assigned, nil
}

// contextDigest is a short digest of exactly what the execution was given: its subtask and
// its dependencies' outputs (the real work of this example worker).
func contextDigest(ctx *podiumpb.ExecutionContext) (string, error) {
	h := sha256.New()
	subtask, err := proto.MarshalOptions{Deterministic: true}.Marshal(ctx.GetSubtask())
	if err != nil {
		return "", err
	}
	h.Write(subtask)
	for _, dep := range ctx.GetDependencyResults() {
		h.Write([]byte(dep.GetSubtaskId()))
		h.Write([]byte{0})
		h.Write([]byte(dep.GetOutput()))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))[:12], nil
}

// execute runs one assignment published at publishedAt and returns its result: a sha256 of
// the context given, timed on the wall clock. Its simulated span is its real one (one
// simulated unit = one second), as subagent_svc's plug-in runner records it: it starts at the
// assignment's simulated time plus the seconds it waited since its publication (never
// before it: a clock skew counts as no wait) and lasts its wall-clock duration.
func execute(a *podiumpb.SubtaskAssigned, publishedAt time.Time, executor string, now func() time.Time) *podiumpb.SubtaskResult {
	start := now()
	digest, err := contextDigest(a.GetContext())
	end := now()
	wallStart := float64(start.UnixNano()) / 1e9
	wallEnd := float64(end.UnixNano()) / 1e9
	simStart := a.GetSimTime()
	if !publishedAt.IsZero() {
		simStart += max(0, start.Sub(publishedAt).Seconds())
	}
	args, _ := json.Marshal(map[string]any{"subtask": a.GetSubtaskId(), "dependencies": len(a.GetContext().GetDependencyResults())})
	result := &podiumpb.SubtaskResult{
		SessionId:   a.GetSessionId(),
		ExecutionId: a.GetExecutionId(),
		SubtaskId:   a.GetSubtaskId(),
		Agent:       a.GetAgent(),
		StartTime:   simStart,
		EndTime:     simStart + max(0, wallEnd-wallStart),
		Context:     a.GetContext(),
		WallStart:   wallStart,
		WallEnd:     wallEnd,
		Executor:    executor,
		Runner:      "external",
		ToolCalls: []*podiumpb.ToolCall{{
			Name:          "go.sha256",
			ArgumentsJson: string(args),
			Ok:            err == nil,
			ResultDigest:  digest,
			StartedAt:     wallStart,
			EndedAt:       wallEnd,
		}},
	}
	if err != nil {
		result.Outcome = podiumpb.Outcome_OUTCOME_MALFORMED
		result.Error = fmt.Sprintf("%s cannot read the context of %s: %v", a.GetAgent(), a.GetSubtaskId(), err)
		return result
	}
	result.Outcome = podiumpb.Outcome_OUTCOME_SUCCESS
	result.Output = fmt.Sprintf("%s:%s:%s", a.GetKind(), a.GetSubtaskId(), digest)
	return result
}

// resultEnvelope wraps result as Podium's codec does: the stable event id, the type, the
// producer, the times, the assignment's trace context (so the result joins the session's
// trace), the execution id as idempotency key and the session id as key.
func resultEnvelope(result *podiumpb.SubtaskResult, assignedEnv *podiumpb.Envelope, producer string, now time.Time) (*podiumpb.Envelope, error) {
	payload, err := anypb.New(result)
	if err != nil {
		return nil, err
	}
	ts := timestamppb.New(now)
	return &podiumpb.Envelope{
		EventId:        resultEventID(result.GetExecutionId()),
		Type:           "podium.v1.SubtaskResult",
		SchemaVersion:  schemaVersion,
		Producer:       producer,
		ProducedAt:     ts,
		OccurredAt:     ts,
		TraceContext:   assignedEnv.GetTraceContext(),
		IdempotencyKey: result.GetExecutionId(),
		Key:            result.GetSessionId(),
		Payload:        payload,
	}, nil
}
