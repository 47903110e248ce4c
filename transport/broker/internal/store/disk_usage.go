package store

// DiskUsage returns the bytes available to unprivileged users on the file
// system holding dir and its capacity as df counts it (see statfs), or an
// error on platforms where that is not supported.
func DiskUsage(dir string) (avail, total uint64, err error) { return statfs(dir) }
