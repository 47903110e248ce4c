//go:build !(linux || darwin || freebsd || netbsd || openbsd)

package store

import "errors"

// statfs is not implemented on this platform: a disk high-water mark
// needs Options.DiskUsage.
func statfs(string) (avail, total uint64, err error) {
	return 0, 0, errors.New("store: disk usage is not supported on this platform")
}
