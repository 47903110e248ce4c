package javatest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/javapeer"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// The restricted cluster: a Java cluster per version, shared by the tests
// that need what the shared one lacks: ACL (users below, with topic
// aclDenied denied to aclUser) and a short queue lock lifetime.
const (
	aclAdminKey    = "RunnelAdmin"
	aclAdminSecret = "runnel-admin-secret"
	aclUserKey     = "RunnelUser"
	aclUserSecret  = "runnel-user-secret"
	aclDenied      = "acl_denied_topic"
	// lockLifetime is the restricted broker's
	// rocketmq.broker.rebalance.lockMaxLiveTime (Java's default: 60 s).
	lockLifetime = 3 * time.Second
)

// plainACL is conf/plain_acl.yml, RocketMQ's ACL 1.0 file: 4.9 reads it
// (aclEnable=true); 5.3 has no ACL 1.0 any more and migrates it into its
// ACL 2.0 users and policies at start (migrateAuthFromV1Enabled).
const plainACL = `globalWhiteRemoteAddresses:
accounts:
  - accessKey: ` + aclAdminKey + `
    secretKey: ` + aclAdminSecret + `
    whiteRemoteAddress:
    admin: true
  - accessKey: ` + aclUserKey + `
    secretKey: ` + aclUserSecret + `
    whiteRemoteAddress:
    admin: false
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: PUB|SUB
    topicPerms:
      - ` + aclDenied + `=DENY
`

func restrictedOptions(v string) []javapeer.Option {
	opts := []javapeer.Option{
		javapeer.WithHomeFile("conf/plain_acl.yml", plainACL),
		javapeer.WithBrokerSystemProperty("rocketmq.broker.rebalance.lockMaxLiveTime", fmt.Sprint(lockLifetime.Milliseconds())),
	}
	if v == javapeer.Version4 {
		return append(opts, javapeer.WithBrokerProperty("aclEnable", "true"))
	}
	// 5.3.3: BrokerConfig.aclEnable is no longer read (the ACL 1.0
	// validator is gone); authentication and authorization are ACL 2.0's.
	const auth = "org.apache.rocketmq.auth."
	for k, val := range map[string]string{
		"authenticationEnabled":                "true",
		"authenticationProvider":               auth + "authentication.provider.DefaultAuthenticationProvider",
		"authenticationMetadataProvider":       auth + "authentication.provider.LocalAuthenticationMetadataProvider",
		"authorizationEnabled":                 "true",
		"authorizationProvider":                auth + "authorization.provider.DefaultAuthorizationProvider",
		"authorizationMetadataProvider":        auth + "authorization.provider.LocalAuthorizationMetadataProvider",
		"migrateAuthFromV1Enabled":             "true",
		"innerClientAuthenticationCredentials": `{"accessKey":"` + aclAdminKey + `","secretKey":"` + aclAdminSecret + `"}`,
	} {
		opts = append(opts, javapeer.WithBrokerProperty(k, val))
	}
	return opts
}

// restricted serialises the start of each version's restricted cluster
// on a lock of its own, so that the two versions boot in parallel (the
// clusters are kept in shared, which TestMain closes).
var restricted struct {
	mu    sync.Mutex
	locks map[string]*sync.Mutex
}

// restrictedCluster returns version v's restricted cluster, started on
// first use and closed by TestMain with the shared ones.
func restrictedCluster(t testing.TB, v string) (*javapeer.Dist, *javapeer.Cluster) {
	t.Helper()
	d := javapeer.RequireVersion(t, v)
	key := v + "-restricted"
	restricted.mu.Lock()
	if restricted.locks == nil {
		restricted.locks = map[string]*sync.Mutex{}
	}
	l := restricted.locks[key]
	if l == nil {
		l = new(sync.Mutex)
		restricted.locks[key] = l
	}
	restricted.mu.Unlock()
	l.Lock()
	defer l.Unlock()
	shared.mu.Lock()
	err, c := shared.errs[key], shared.clusters[key]
	shared.mu.Unlock()
	if err != nil {
		t.Fatalf("restricted Apache RocketMQ %s cluster: %v", v, err)
	}
	if c != nil {
		return d, c
	}
	dir, err := os.MkdirTemp("", "runnel-javatest-"+key+"-")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c, err = d.StartCluster(ctx, dir, restrictedOptions(v)...)
	shared.mu.Lock()
	defer shared.mu.Unlock()
	shared.dirs = append(shared.dirs, dir)
	if err != nil {
		if shared.errs == nil {
			shared.errs = map[string]error{}
		}
		shared.errs[key] = err
		t.Fatalf("restricted Apache RocketMQ %s cluster: %v", v, err)
	}
	if shared.clusters == nil {
		shared.clusters = map[string]*javapeer.Cluster{}
	}
	shared.clusters[key] = c
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("Apache RocketMQ %s logs (restricted cluster in %s):\n%s", v, dir, c.Logs())
		}
	})
	return d, c
}

// eachRestricted runs fn as a parallel subtest per pinned version, on that
// version's restricted cluster.
func eachRestricted(t *testing.T, fn func(t *testing.T, d *javapeer.Dist, c *javapeer.Cluster)) {
	t.Helper()
	for _, v := range brokerVersions {
		t.Run(v, func(t *testing.T) {
			t.Parallel()
			d, c := restrictedCluster(t, v)
			awaitRegistered(t, c)
			fn(t, d, c)
		})
	}
}

func adminCreds() client.Option {
	return client.WithCredentials(client.Credentials{AccessKey: aclAdminKey, SecretKey: aclAdminSecret})
}

// TestJavaBrokerACL: runnel's signed requests (transport/client's
// AclClientRPCHook signature) are accepted by the Java broker with ACL on,
// for admin calls, sends, pulls, heartbeats and offsets; a wrong secret, an
// unknown access key, no credentials at all and a topic the user is denied
// get the broker's refusal: SYSTEM_ERROR with the AclException's message on
// 4.9 (its remoting layer answers every hook exception so), NO_PERMISSION
// on 5.3.
func TestJavaBrokerACL(t *testing.T) {
	eachRestricted(t, func(t *testing.T, d *javapeer.Dist, c *javapeer.Cluster) {
		ctx := bg(t, 2*time.Minute)
		admin := newJavaClient(t, c, adminCreds())
		topic := uniqueName(t, "acl")
		qs := createJavaTopic(t, admin, c, topic, 2)
		createJavaTopic(t, admin, c, aclDenied, 1)

		user := newJavaClient(t, c, client.WithCredentials(client.Credentials{AccessKey: aclUserKey, SecretKey: aclUserSecret}))
		p := newJavaProducer(t, user, uniqueName(t, "pg"))
		res, err := p.Send(ctx, &client.Message{Topic: topic, Body: []byte("signed"), Tags: "t", Keys: []string{"k"},
			Properties: map[string]string{"p": "v"}})
		if err != nil {
			t.Fatalf("signed send: %v", err)
		}
		batch := []*client.Message{{Topic: topic, Body: []byte("b1")}, {Topic: topic, Body: []byte("b2")}}
		if _, err := p.Send(ctx, batch...); err != nil {
			t.Fatalf("signed batch: %v", err)
		}
		group := uniqueName(t, "g")
		got := pullQueuesTopic(t, user, qs, group, 3, 20*time.Second)
		if m, ok := got[res.MsgID]; !ok || string(m.Body) != "signed" {
			t.Fatalf("signed pull read %d messages, not the one sent", len(got))
		}
		g := startGroup(t, user, group, topic, client.WithRebalanceInterval(noTimer))
		if n := len(waitAssigned(t, "signed member", g, 2)); n != 2 {
			t.Fatal(n)
		}
		if err := user.CommitOffset(ctx, group, qs[0], 1); err != nil {
			t.Fatalf("signed commit: %v", err)
		}
		if off, err := user.QueryConsumerOffset(ctx, group, qs[0]); err != nil || off != 1 {
			t.Fatalf("signed offset query: %d, %v", off, err)
		}

		// The signature covers the ext fields whatever the header encoding.
		jsonUser := newJavaClient(t, c, client.WithHeaderEncoding(protocol.SerializeJSON),
			client.WithCredentials(client.Credentials{AccessKey: aclUserKey, SecretKey: aclUserSecret}))
		jres, err := newJavaProducer(t, jsonUser, uniqueName(t, "pg")).Send(ctx, &client.Message{Topic: topic, Body: []byte("signed json"), Tags: "t"})
		if err != nil {
			t.Fatalf("signed send with JSON headers: %v", err)
		}
		if got := pullAll(t, jsonUser, jres.Queue, group, jres.QueueOffset, 1, 10*time.Second); len(got) != 1 || string(got[0].Body) != "signed json" {
			t.Fatalf("signed pull with JSON headers read %d messages", len(got))
		}

		// Refusals.
		want := protocol.ResSystemError
		if d.Version != javapeer.Version4 {
			want = protocol.ResNoPermission
		}
		refused := func(what string, err error, remark string) {
			t.Helper()
			var pe *protocol.Error
			if !errors.As(err, &pe) || pe.Code != want {
				t.Fatalf("%s: %v, want a reply with code %d", what, err, want)
			}
			if !strings.Contains(strings.ToLower(pe.Remark), remark) {
				t.Fatalf("%s: remark %q lacks %q", what, pe.Remark, remark)
			}
			if client.MaybeApplied(err) {
				t.Fatalf("%s: MaybeApplied(%v)", what, err)
			}
			t.Logf("%s: %v", what, err)
		}
		msg := &client.Message{Topic: topic, Body: []byte("refused")}
		unknownUser := "not found" // 5.3: "User:NoSuchUser is not found."
		if d.Version == javapeer.Version4 {
			unknownUser = "no acl config"
		}
		for _, tc := range []struct {
			what, key, secret, remark string
		}{
			{"wrong secret", aclUserKey, "not-the-secret", "signature"},
			{"unknown access key", "NoSuchUser", aclUserSecret, unknownUser},
		} {
			bad := newJavaClient(t, c, client.WithCredentials(client.Credentials{AccessKey: tc.key, SecretKey: tc.secret}))
			bp := newJavaProducer(t, bad, uniqueName(t, "pg"), client.WithRetries(0))
			_, err := bp.Send(ctx, msg)
			refused(tc.what+": send", err, tc.remark)
			_, err = bad.Pull(ctx, client.PullRequest{Queue: qs[0], Group: group})
			refused(tc.what+": pull", err, tc.remark)
		}
		anon := newJavaClient(t, c)
		_, err = newJavaProducer(t, anon, uniqueName(t, "pg"), client.WithRetries(0)).Send(ctx, msg)
		var pe *protocol.Error
		if !errors.As(err, &pe) || pe.Code != want {
			t.Fatalf("unsigned send: %v, want a reply with code %d", err, want)
		}
		t.Logf("unsigned send: %v", err)
		_, err = p.Send(ctx, &client.Message{Topic: aclDenied, Body: []byte("denied")})
		if !errors.As(err, &pe) || pe.Code != want {
			t.Fatalf("send to a denied topic: %v, want a reply with code %d", err, want)
		}
		t.Logf("send to a denied topic: %v", err)
		// Admin calls need an admin user.
		err = user.CreateTopic(ctx, c.Broker, client.TopicConfig{TopicName: uniqueName(t, "nope")})
		if !errors.As(err, &pe) || pe.Code != want {
			t.Fatalf("create topic as a normal user: %v, want a reply with code %d", err, want)
		}
		t.Logf("create topic as a normal user: %v", err)
	})
}
