package javapeer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// The pinned Apache RocketMQ versions.
const (
	// Version5 is the 5.x release runnel is tested against.
	Version5 = "5.3.3"
	// Version4 is the last 4.9 release with all four artifacts on Maven
	// Central.
	Version4 = "4.9.7"
)

// ErrUnavailable is returned (wrapped, with what is missing) when this
// machine lacks java, javac or mvn.
var ErrUnavailable = errors.New("javapeer: Java peer unavailable")

// fetchTimeout bounds one Maven resolution (a cold one downloads ~85 MB).
const fetchTimeout = 10 * time.Minute

// artifacts are resolved, with their dependencies, for every version.
var artifacts = []string{"rocketmq-namesrv", "rocketmq-broker", "rocketmq-client", "rocketmq-tools"}

// Dist is one resolved Apache RocketMQ version on disk. Its fields are set
// by Fetch and only read afterwards.
type Dist struct {
	// Version is the RocketMQ version, e.g. "5.3.3".
	Version string
	// Lib holds every jar of the four artifacts and their dependencies.
	Lib string
	// Home is what ROCKETMQ_HOME points to (4.9 reads conf/ from it).
	Home string
	// Java is the java executable used to run everything.
	Java  string
	javac string
}

// Major is the version's major number (4 or 5).
func (d *Dist) Major() int {
	if strings.HasPrefix(d.Version, "4.") {
		return 4
	}
	return 5
}

// Classpath is the class path of every jar of d.
func (d *Dist) Classpath() string { return filepath.Join(d.Lib, "*") }

// Tools reports which of java, javac and mvn are missing from PATH, as an
// ErrUnavailable error, or nil when all three are there.
func Tools() error {
	var missing []string
	for _, tool := range []string{"java", "javac", "mvn"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: %s not on PATH", ErrUnavailable, strings.Join(missing, ", "))
	}
	return nil
}

// cacheRoot is where resolved versions live.
func cacheRoot() (string, error) {
	if dir := os.Getenv("RUNNEL_JAVA_PEER_CACHE"); dir != "" {
		return dir, nil
	}
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("javapeer: no cache directory (set RUNNEL_JAVA_PEER_CACHE): %w", err)
	}
	return filepath.Join(dir, "runnel-javapeer"), nil
}

// Fetch resolves version (Version5 or Version4) from Maven Central into the
// cache, or returns the cached copy. Concurrent callers, in one process or
// several (go test runs packages in parallel), serialise on a lock file;
// the first resolves, the others find its result. It blocks for at most
// ctx and fetchTimeout.
func Fetch(ctx context.Context, version string) (*Dist, error) {
	if version != Version5 && version != Version4 {
		return nil, fmt.Errorf("javapeer: version %q is not pinned (want %s or %s)", version, Version5, Version4)
	}
	if err := Tools(); err != nil {
		return nil, err
	}
	root, err := cacheRoot()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(root, version)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("javapeer: %w", err)
	}
	java, _ := exec.LookPath("java")
	javac, _ := exec.LookPath("javac")
	d := &Dist{Version: version, Lib: filepath.Join(dir, "lib"), Home: filepath.Join(dir, "home"), Java: java, javac: javac}
	unlock, err := lockFile(ctx, dir+".lock")
	if err != nil {
		return nil, err
	}
	defer unlock()
	done := filepath.Join(dir, "complete")
	if _, err := os.Stat(done); err == nil {
		return d, nil
	}
	if err := d.resolve(ctx, dir); err != nil {
		return nil, err
	}
	if err := d.writeHome(); err != nil {
		return nil, err
	}
	if err := os.WriteFile(done, []byte(version+"\n"), 0o644); err != nil {
		return nil, fmt.Errorf("javapeer: %w", err)
	}
	return d, nil
}

// resolve runs Maven on a generated pom into dir/lib.
func (d *Dist) resolve(ctx context.Context, dir string) error {
	var deps strings.Builder
	for _, a := range artifacts {
		fmt.Fprintf(&deps, "    <dependency><groupId>org.apache.rocketmq</groupId><artifactId>%s</artifactId><version>%s</version></dependency>\n", a, d.Version)
	}
	pom := `<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.runnel</groupId>
  <artifactId>javapeer</artifactId>
  <version>1</version>
  <dependencies>
` + deps.String() + `  </dependencies>
  <build><plugins><plugin>
    <groupId>org.apache.maven.plugins</groupId><artifactId>maven-dependency-plugin</artifactId><version>3.6.1</version>
  </plugin></plugins></build>
</project>
`
	if err := os.WriteFile(filepath.Join(dir, "pom.xml"), []byte(pom), 0o644); err != nil {
		return fmt.Errorf("javapeer: %w", err)
	}
	tmp := filepath.Join(dir, "lib.tmp")
	_ = os.RemoveAll(tmp)
	ctx, cancel := context.WithTimeout(ctx, fetchTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "mvn", "-B", "-q", "-f", filepath.Join(dir, "pom.xml"),
		"dependency:copy-dependencies", "-DoutputDirectory="+tmp, "-DincludeScope=runtime")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("javapeer: mvn could not resolve Apache RocketMQ %s from Maven Central (set RUNNEL_TEST_JAVA=0 to skip the Java-peer tests): %w\n%s", d.Version, err, Tail(out.Bytes(), 30))
	}
	jars, _ := filepath.Glob(filepath.Join(tmp, "rocketmq-broker-*.jar"))
	if len(jars) == 0 {
		return fmt.Errorf("javapeer: mvn finished but %s has no rocketmq-broker jar", tmp)
	}
	_ = os.RemoveAll(d.Lib)
	if err := os.Rename(tmp, d.Lib); err != nil {
		return fmt.Errorf("javapeer: %w", err)
	}
	return nil
}

// logback4 is the logback configuration 4.9 loads from $ROCKETMQ_HOME/conf:
// everything at INFO into one file under the process's user.home, which
// the harness points into the cluster's directory.
const logback4 = `<configuration>
  <appender name="FILE" class="ch.qos.logback.core.FileAppender">
    <file>${user.home}/logs/rocketmqlogs/%s.log</file>
    <encoder><pattern>%%d{HH:mm:ss.SSS} %%-5level [%%thread] %%logger{24} - %%msg%%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="FILE"/></root>
</configuration>
`

// writeHome writes ROCKETMQ_HOME's conf/ directory.
func (d *Dist) writeHome() error {
	conf := filepath.Join(d.Home, "conf")
	if err := os.MkdirAll(conf, 0o755); err != nil {
		return fmt.Errorf("javapeer: %w", err)
	}
	for _, name := range []string{"namesrv", "broker", "tools", "filtersrv"} {
		b := fmt.Appendf(nil, logback4, name)
		if err := os.WriteFile(filepath.Join(conf, "logback_"+name+".xml"), b, 0o644); err != nil {
			return fmt.Errorf("javapeer: %w", err)
		}
	}
	return nil
}

// lockFile takes an exclusive flock on path, polling so that ctx bounds the
// wait, and returns its release.
func lockFile(ctx context.Context, path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("javapeer: %w", err)
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); _ = f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			_ = f.Close()
			return nil, fmt.Errorf("javapeer: lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			_ = f.Close()
			return nil, fmt.Errorf("javapeer: waiting for %s: %w", path, ctx.Err())
		case <-tick.C:
		}
	}
}

// Tail returns the last n lines of b (a process's output or log, for a
// test failure's message).
func Tail(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
