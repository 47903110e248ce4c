package state

// DefaultMaxParallelism is the default number of key groups.
const DefaultMaxParallelism = 128

// MaxMaxParallelism is the largest supported number of key groups.
const MaxMaxParallelism = 1 << 15

// KeyGroup returns key's key group in [0, maxParallelism): the 64-bit FNV-1a
// hash of the key, finalised with murmur3's fmix64, modulo maxParallelism.
// The function is part of the durable format: it never changes.
// maxParallelism outside [1, MaxMaxParallelism] is treated as
// DefaultMaxParallelism.
func KeyGroup(key []byte, maxParallelism int) uint16 {
	if maxParallelism < 1 || maxParallelism > MaxMaxParallelism {
		maxParallelism = DefaultMaxParallelism
	}
	h := uint64(14695981039346656037)
	for _, c := range key {
		h ^= uint64(c)
		h *= 1099511628211
	}
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return uint16(h % uint64(maxParallelism))
}

// KeyGroupRange returns the key groups [start, end) that subtask (of
// parallelism subtasks) owns: contiguous ranges, as in Flink, so that a key
// group moves as a unit when parallelism changes.
func KeyGroupRange(maxParallelism, parallelism, subtask int) (start, end uint16) {
	if parallelism < 1 || subtask < 0 || subtask >= parallelism {
		return 0, 0
	}
	start = uint16((subtask*maxParallelism + parallelism - 1) / parallelism)
	end = uint16(((subtask+1)*maxParallelism + parallelism - 1) / parallelism)
	return start, end
}

// SubtaskOf returns the subtask that owns keyGroup (the inverse of
// KeyGroupRange).
func SubtaskOf(keyGroup uint16, maxParallelism, parallelism int) int {
	if maxParallelism < 1 {
		return 0
	}
	return int(keyGroup) * parallelism / maxParallelism
}
