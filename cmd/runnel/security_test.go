package main

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/syncbuf"
	"github.com/runnel-dev/runnel/internal/testutil/testcert"
	"github.com/runnel-dev/runnel/transport/acl"
	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

const aclOneAccount = `{"accounts":[{"accessKey":"admin-ak","secretKey":"admin-secret","admin":true}]}`

const aclTwoAccounts = `{"accounts":[{"accessKey":"admin-ak","secretKey":"admin-secret","admin":true},
  {"accessKey":"reader-ak","secretKey":"reader-secret","defaultTopicPerm":"SUB"}]}`

// TestNamesrvACLAndTLS runs `runnel broker --no-broker` with an ACL file
// and enforcing TLS as a real process: unsigned requests are refused,
// signed ones served over TLS, plain TCP gets nothing, and SIGHUP reloads
// the file (a broken file is reported and the old one stays).
func TestNamesrvACLAndTLS(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir := t.TempDir()
	cert := testcert.New(t, "tls")
	files := cert.WriteFiles(t, dir)
	certFile, keyFile, cliTLS := files.Cert, files.Key, cert.ClientTLS()
	aclFile := filepath.Join(dir, "acl.json")
	if err := os.WriteFile(aclFile, []byte(aclOneAccount), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := runnelCmd(ctx, "broker", "--no-broker", "--namesrv-listen", "127.0.0.1:0", "--log-level", "warn",
		"--acl-file", aclFile, "--tls-cert", certFile, "--tls-key", keyFile)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr syncbuf.Buffer // written by exec's copying goroutine while the test reads it
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill() }()
	lines := bufio.NewScanner(stdout)
	out := make(chan string, 16)
	go func() { // ends when the process closes stdout
		defer close(out)
		for lines.Scan() {
			out <- lines.Text()
		}
	}()
	var ready string
	for l := range out {
		if strings.HasPrefix(l, "runnel: ready") {
			ready = l
			break
		}
	}
	if !strings.Contains(ready, " tls=enforcing") || !strings.Contains(ready, " acl=on") {
		t.Fatalf("readiness line %q (stderr %s)", ready, stderr.String())
	}
	var addr string
	for _, f := range strings.Fields(ready) {
		if v, ok := strings.CutPrefix(f, "namesrv="); ok {
			addr = v
		}
	}

	conn, err := remoting.Dial(ctx, addr, remoting.WithTLSConfig(cliTLS))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ask := func(cr *acl.Credentials) *protocol.Command {
		req := protocol.NewRequest(protocol.ReqGetRouteInfoByTopic)
		(&protocol.GetRouteInfoRequestHeader{Topic: "T"}).Encode(req)
		if cr != nil {
			acl.Sign(req, *cr)
		}
		resp, err := conn.Invoke(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	denied := func(r *protocol.Command) bool {
		return r.Code == protocol.ResNoPermission && strings.HasPrefix(r.Remark, "acl: ")
	}
	admin := &acl.Credentials{AccessKey: "admin-ak", SecretKey: "admin-secret"}
	reader := &acl.Credentials{AccessKey: "reader-ak", SecretKey: "reader-secret"}
	if r := ask(nil); !denied(r) {
		t.Fatalf("unsigned route request: %d %q", r.Code, r.Remark)
	}
	if r := ask(admin); denied(r) {
		t.Fatalf("admin route request denied: %q", r.Remark)
	}
	if r := ask(reader); !denied(r) || !strings.Contains(r.Remark, "unknown AccessKey") {
		t.Fatalf("reader before reload: %d %q", r.Code, r.Remark)
	}
	plain, err := remoting.Dial(ctx, addr)
	if err == nil {
		_, err = plain.Invoke(ctx, protocol.NewRequest(protocol.ReqGetBrokerClusterInfo))
		plain.Close()
	}
	if err == nil {
		t.Fatal("plain TCP served by an enforcing TLS port")
	}

	hupAndWait := func(want string) {
		t.Helper()
		if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		deadline := time.After(20 * time.Second)
		for {
			select {
			case l := <-out:
				if strings.Contains(l, want) {
					return
				}
			case <-deadline:
				t.Fatalf("no %q after SIGHUP; stderr:\n%s", want, stderr.String())
			}
		}
	}
	if err := os.WriteFile(aclFile, []byte(aclTwoAccounts), 0o600); err != nil {
		t.Fatal(err)
	}
	hupAndWait("runnel: ACL reloaded")
	if r := ask(reader); denied(r) {
		t.Fatalf("reader after reload: %q", r.Remark)
	}
	// A broken file: the process keeps running with the last good ACL.
	if err := os.WriteFile(aclFile, []byte(`{"accounts":[{"accessKey":"x"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(stderr.String(), "ACL reload failed") {
		if time.Now().After(deadline) {
			t.Fatalf("no reload failure reported; stderr:\n%s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond) // polling the child's output
	}
	if r := ask(reader); denied(r) {
		t.Fatalf("reader after a failed reload: %q", r.Remark)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for range out {
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit after SIGTERM: %v\nstderr:\n%s", err, stderr.String())
	}
}

// TestSecurityFlagErrors checks that security flags that cannot work fail
// start-up with a clear message.
func TestSecurityFlagErrors(t *testing.T) {
	dir := t.TempDir()
	files := testcert.New(t, "tls").WriteFiles(t, dir)
	certFile, keyFile := files.Cert, files.Key
	good := filepath.Join(dir, "acl.json")
	if err := os.WriteFile(good, []byte(aclOneAccount), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"accounts":[{"accessKey":"admin-ak","secretKey":"s"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	ns := []string{"broker", "--no-broker", "--namesrv-listen", "127.0.0.1:0"}
	both := []string{"broker", "--namesrv-listen", "127.0.0.1:0", "--listen", "127.0.0.1:0", "--data", t.TempDir()}
	secret := writeFile(t, dir, "admin.secret", "admin-secret\n")
	readerSecret := writeFile(t, dir, "reader.secret", "reader-secret")
	empty := writeFile(t, dir, "empty.secret", " \n")
	reader := writeFile(t, dir, "reader.json", aclTwoAccounts)
	cases := []struct {
		args []string
		want string
	}{
		{append(ns, "--tls-mode", "strict"), `TLS mode "strict"`},
		{append(ns, "--acl-file", good), "--acl-file implies --tls-mode enforcing"},
		{append(ns, "--tls-mode", "enforcing", "--tls-cert", certFile), "both a certificate file and a key file"},
		{append(ns, "--tls-cert", certFile, "--tls-key", keyFile), "need --tls-mode permissive or enforcing"},
		{append(ns, "--acl-file", bad, "--tls-mode", "disabled"), "accounts[0].secretKey: must be at least 6"},
		{append(ns, "--acl-file", filepath.Join(dir, "none.json"), "--tls-mode", "disabled"), "no such file"},
		{append(both, "--acl-file", good, "--tls-mode", "disabled"), "give the broker an admin account"},
		{append(both, "--acl-file", good, "--tls-mode", "disabled", "--namesrv-access-key", "admin-ak"), "go together"},
		{append(both, "--acl-file", good, "--tls-mode", "disabled", "--namesrv-access-key", "nobody", "--namesrv-secret-key-file", secret),
			`"nobody" is not an account`},
		{append(both, "--acl-file", reader, "--tls-mode", "disabled", "--namesrv-access-key", "reader-ak", "--namesrv-secret-key-file", readerSecret),
			"needs an admin account"},
		{append(both, "--acl-file", good, "--tls-mode", "disabled", "--namesrv-access-key", "admin-ak", "--namesrv-secret-key-file", readerSecret),
			"does not hold the secret key"},
		{append(both, "--acl-file", good, "--tls-mode", "disabled", "--namesrv-access-key", "admin-ak", "--namesrv-secret-key-file", empty),
			"is empty"},
		{append(ns, "--namesrv-access-key", "admin-ak", "--namesrv-secret-key-file", secret), "not with --no-broker"},
		{append(both, "--namesrv-tls-ca", keyFile), "holds no PEM certificate"},
		{append(both, "--max-conns", "-1"), "--max-conns -1"},
		{append(both, "--max-conns-per-ip", "-2"), "--max-conns-per-ip -2"},
		{append(both, "--max-conn-rate", "-5"), "--max-conn-rate -5"},
		{append(both, "--disk-high-watermark", "1.5"), "--disk-high-watermark 1.5: must be in (0, 1]"},
		{append(both, "--retention", "-1h"), "--retention -1h0m0s: must be 0 (keep) or positive"},
		{append(both, "--max-batch-messages", "0"), "max batch messages 0"},
		{append(both, "--idle-timeout", "-1s"), "--idle-timeout -1s"},
		{append(both, "--max-queued-bytes", "-1"), "--max-queued-bytes -1"},
		{append(both, "--max-frame-size", "10"), "--max-frame-size 10"},
		{append(both, "--max-message-size", "0"), "max message size 0"},
		{append(both, "--max-suspend", "30s"), "max suspend 30s outside [0, 30s)"},
		{append(both, "--max-parked-pulls", "-1"), "max parked pulls -1"},
		{[]string{"broker", "--no-namesrv", "--namesrv", "127.0.0.1:9", "--tls-mode", "permissive"}, "both a certificate file and a key file"},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args[1:], " "), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			out, err := runnelCmd(ctx, tc.args...).CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 1 {
				t.Fatalf("exit: %v, want status 1; output:\n%s", err, out)
			}
			if !strings.Contains(string(out), tc.want) {
				t.Fatalf("output does not mention %q:\n%s", tc.want, out)
			}
		})
	}
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestBrokerACLAndTLS runs `runnel broker` (name server and broker) with an
// ACL file, enforcing TLS and the broker's registration credentials as a
// real process: the broker registered (signed, over TLS) with the embedded
// name server, a signed send over TLS is stored, an unsigned one and one
// with a wrong secret are refused, plain TCP to the broker gets nothing.
func TestBrokerACLAndTLS(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir := t.TempDir()
	cert := testcert.New(t, "tls")
	files := cert.WriteFiles(t, dir)
	certFile, keyFile, cliTLS := files.Cert, files.Key, cert.ClientTLS()
	aclFile := writeFile(t, dir, "acl.json", aclTwoAccounts)
	secretFile := writeFile(t, dir, "ns.secret", "admin-secret\n")
	cmd := runnelCmd(ctx, "broker", "--namesrv-listen", "127.0.0.1:0", "--listen", "127.0.0.1:0",
		"--data", filepath.Join(dir, "data"), "--log-level", "warn", "--flush", "async",
		"--acl-file", aclFile, "--tls-cert", certFile, "--tls-key", keyFile,
		"--namesrv-access-key", "admin-ak", "--namesrv-secret-key-file", secretFile,
		"--max-conns", "100", "--max-conns-per-ip", "50")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr syncbuf.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill() }()
	lines := bufio.NewScanner(stdout)
	var ready string
	for lines.Scan() {
		if l := lines.Text(); strings.HasPrefix(l, "runnel: ready") {
			ready = l
			break
		}
	}
	go func() { // drain until the process closes stdout
		for lines.Scan() {
		}
	}()
	if !strings.Contains(ready, " tls=enforcing") || !strings.Contains(ready, " acl=on") {
		t.Fatalf("readiness line %q (stderr %s)", ready, stderr.String())
	}
	var nsAddr, brokerAddr string
	for _, f := range strings.Fields(ready) {
		if v, ok := strings.CutPrefix(f, "namesrv="); ok {
			nsAddr = v
		}
		if v, ok := strings.CutPrefix(f, "broker="); ok {
			brokerAddr = v
		}
	}
	admin := acl.Credentials{AccessKey: "admin-ak", SecretKey: "admin-secret"}
	nsConn, err := remoting.Dial(ctx, nsAddr, remoting.WithTLSConfig(cliTLS))
	if err != nil {
		t.Fatal(err)
	}
	defer nsConn.Close()
	route := protocol.NewRequest(protocol.ReqGetRouteInfoByTopic)
	(&protocol.GetRouteInfoRequestHeader{Topic: "TBW102"}).Encode(route)
	acl.Sign(route, admin)
	resp, err := nsConn.Invoke(ctx, route)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Code != protocol.ResSuccess {
		t.Fatalf("route of TBW102: %d %q: the broker did not register; stderr:\n%s", resp.Code, resp.Remark, stderr.String())
	}

	bc, err := remoting.Dial(ctx, brokerAddr, remoting.WithTLSConfig(cliTLS))
	if err != nil {
		t.Fatal(err)
	}
	defer bc.Close()
	send := func(cr *acl.Credentials) *protocol.Command {
		req := protocol.NewRequest(protocol.ReqSendMessage)
		(&protocol.SendMessageRequestHeader{ProducerGroup: "pg", Topic: "Orders", DefaultTopic: "TBW102",
			DefaultTopicQueueNums: 4, BornTimestamp: time.Now().UnixMilli()}).Encode(req)
		req.Body = []byte("order")
		if cr != nil {
			acl.Sign(req, *cr)
		}
		resp, err := bc.Invoke(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	if r := send(&admin); r.Code != protocol.ResSuccess {
		t.Fatalf("signed send: %d %q", r.Code, r.Remark)
	}
	if r := send(&acl.Credentials{AccessKey: "reader-ak", SecretKey: "reader-secret"}); r.Code != protocol.ResNoPermission {
		t.Fatalf("send by a SUB-only account: %d %q", r.Code, r.Remark)
	}
	if r := send(nil); r.Code != protocol.ResNoPermission || !strings.HasPrefix(r.Remark, "acl: ") {
		t.Fatalf("unsigned send: %d %q", r.Code, r.Remark)
	}
	if r := send(&acl.Credentials{AccessKey: "admin-ak", SecretKey: "wrong-secret"}); r.Code != protocol.ResNoPermission {
		t.Fatalf("send with a wrong secret: %d %q", r.Code, r.Remark)
	}
	plain, err := remoting.Dial(ctx, brokerAddr)
	if err == nil {
		req := protocol.NewRequest(protocol.ReqHeartbeat)
		_, err = plain.Invoke(ctx, req)
		plain.Close()
	}
	if err == nil {
		t.Fatal("plain TCP served by the broker's enforcing TLS port")
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit after SIGTERM: %v\nstderr:\n%s", err, stderr.String())
	}
	if strings.Contains(stderr.String(), "registration failed") || strings.Contains(stderr.String(), "unregister failed") {
		t.Fatalf("registration problems reported:\n%s", stderr.String())
	}
}

// TestBrokerLimitFlags: the limit flags reach the running ports: with
// --max-message-size 1024 a 2 KiB send is refused MESSAGE_ILLEGAL (a 1 KiB
// one is stored), and with --idle-timeout 1s a connection that sends
// nothing more is closed by the broker.
func TestBrokerLimitFlags(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := runnelCmd(ctx, "broker", "--listen", "127.0.0.1:0", "--namesrv-listen", "127.0.0.1:0",
		"--data", t.TempDir(), "--log-level", "warn", "--max-message-size", "1024", "--idle-timeout", "1s",
		"--max-frame-size", "65536", "--max-queued-bytes", "1048576")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	lines := bufio.NewScanner(stdout)
	var brokerAddr string
	for lines.Scan() {
		if strings.HasPrefix(lines.Text(), "runnel: ready") {
			for _, f := range strings.Fields(lines.Text())[2:] {
				if v, ok := strings.CutPrefix(f, "broker="); ok {
					brokerAddr = v
				}
			}
			break
		}
	}
	if brokerAddr == "" {
		t.Fatalf("no readiness line with the broker address; stderr:\n%s", stderr.String())
	}
	go func() { // keep the pipe drained until the process ends
		for lines.Scan() {
		}
	}()
	conn, err := remoting.Dial(ctx, brokerAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sendBody := func(n int) *protocol.Command {
		req := protocol.NewRequest(protocol.ReqSendMessage)
		(&protocol.SendMessageRequestHeader{ProducerGroup: "PG", Topic: "Limits", DefaultTopic: "TBW102",
			DefaultTopicQueueNums: 4, QueueID: 0, BornTimestamp: time.Now().UnixMilli()}).Encode(req)
		req.Body = make([]byte, n)
		resp, err := conn.Invoke(ctx, req)
		if err != nil {
			t.Fatalf("send of %d bytes: %v", n, err)
		}
		return resp
	}
	if resp := sendBody(1024); resp.Code != protocol.ResSuccess {
		t.Fatalf("1 KiB send: %d %s", resp.Code, resp.Remark)
	}
	if resp := sendBody(2048); resp.Code != protocol.ResMessageIllegal {
		t.Fatalf("2 KiB send with --max-message-size 1024: %d %s, want MESSAGE_ILLEGAL", resp.Code, resp.Remark)
	}
	// Idle: the broker closes the connection after about a second.
	select {
	case <-conn.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("an idle connection was not closed with --idle-timeout 1s")
	}
}
