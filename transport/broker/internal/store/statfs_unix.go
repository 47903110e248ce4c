//go:build linux || darwin || freebsd || netbsd || openbsd

package store

import "syscall"

// statfs returns the bytes of the file system holding dir available to
// unprivileged users and its capacity as df counts it: used plus available
// (blocks reserved for root, or otherwise unusable, are left out, so that
// usage is df's Use%).
func statfs(dir string) (avail, total uint64, err error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, 0, err
	}
	bs := uint64(st.Bsize)
	used := uint64(st.Blocks) - uint64(st.Bfree)
	return uint64(st.Bavail) * bs, (used + uint64(st.Bavail)) * bs, nil
}
