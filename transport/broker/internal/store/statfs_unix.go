//go:build linux || darwin || freebsd || netbsd || openbsd

package store

import "syscall"

// statfs returns the bytes available to unprivileged users and the total
// size of the file system holding dir.
func statfs(dir string) (avail, total uint64, err error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, 0, err
	}
	bs := uint64(st.Bsize)
	return uint64(st.Bavail) * bs, uint64(st.Blocks) * bs, nil
}
