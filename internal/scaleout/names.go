package scaleout

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
)

// maxTopicLen is RocketMQ's limit on topic names.
const maxTopicLen = 127

// Kinds of job-owned topics.
const (
	KindCommit    = "commit"
	KindChangelog = "changelog"
	KindRepart    = "repart"
)

// TopicName returns the name of a job-owned topic of kind for a stage (the
// UID of the stage's head: its source or keyed operator). Characters
// RocketMQ does not allow become '_'; a name that would be longer than
// RocketMQ allows (or that the replacement made ambiguous) keeps a readable
// prefix and ends in a hash of the exact job and stage, so distinct stages
// never share a topic.
func TopicName(job, stage, kind string) string {
	clean := sanitize(job) + "_" + sanitize(stage)
	// "_" joins the parts, so a part containing one could collide with
	// another split of the same string.
	exact := sanitize(job) == job && sanitize(stage) == stage && !strings.Contains(job+stage, "_")
	name := "runnel_" + kind + "_" + clean
	if exact && len(name) <= maxTopicLen {
		return name
	}
	sum := sha256.Sum256([]byte(job + "\x00" + stage))
	h := hex.EncodeToString(sum[:6])
	keep := maxTopicLen - len("runnel_"+kind+"_") - 1 - len(h)
	if len(clean) > keep {
		clean = clean[:keep]
	}
	return "runnel_" + kind + "_" + clean + "_" + h
}

// GroupName is the consumer group the workers of a job join (unless the
// user names one): the job's name, as source/rocketmq's sources of the job
// default to (characters RocketMQ does not allow become '_').
func GroupName(job string) string {
	g := sanitize(job)
	if len(g) > 255 {
		g = g[:255]
	}
	return g
}

func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '-' || r == '_' || (r >= '0' && r <= '9') || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') {
			return r
		}
		return '_'
	}, s)
}

// TaskID names a task: its stage (the UID of the stage's head operator) and
// its unit within the stage (a queue: broker name and queue id).
type TaskID struct {
	Stage  string
	Broker string
	Queue  int32
}

// String is "<stage>@<broker>/<queue>".
func (t TaskID) String() string { return fmt.Sprintf("%s@%s/%d", t.Stage, t.Broker, t.Queue) }

// Dir is a file-system-safe directory name for the task.
func (t TaskID) Dir() string {
	sum := sha256.Sum256([]byte(t.String()))
	name := sanitize(t.Stage) + "_" + sanitize(t.Broker) + fmt.Sprintf("_%d", t.Queue)
	if len(name) > 80 {
		name = name[:80]
	}
	return name + "_" + hex.EncodeToString(sum[:4])
}

// ParseTaskID parses TaskID.String's form.
func ParseTaskID(s string) (TaskID, error) {
	at := strings.LastIndexByte(s, '@')
	if at <= 0 {
		return TaskID{}, fmt.Errorf("scaleout: task id %q: no stage", s)
	}
	rest := s[at+1:]
	sl := strings.LastIndexByte(rest, '/')
	if sl <= 0 {
		return TaskID{}, fmt.Errorf("scaleout: task id %q: no broker/queue", s)
	}
	var q int32
	if _, err := fmt.Sscanf(rest[sl+1:], "%d", &q); err != nil || q < 0 || fmt.Sprint(q) != rest[sl+1:] {
		return TaskID{}, fmt.Errorf("scaleout: task id %q: bad queue", s)
	}
	return TaskID{Stage: s[:at], Broker: rest[:sl], Queue: q}, nil
}
