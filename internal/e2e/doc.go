// Package e2e holds runnel's end-to-end framework tests: typed jobs on the
// in-memory sources, killed with SIGKILL in child processes and restarted
// (exactly-once), and metamorphic runs comparing configurations.
package e2e
